"""Docs without Quarto: README.md from nbs/index.ipynb, and a static HTML site in _docs/.

    python scripts/build_docs.py readme            # write README.md from nbs/index.ipynb
    python scripts/build_docs.py readme --check    # exit 1 if README.md is out of date
    python scripts/build_docs.py html              # execute every notebook, render _docs/*.html
    python scripts/build_docs.py screenshot _docs/07_explore.html shot.png --from The-static-twin

The HTML build executes each notebook with nbclient, skipping cells that carry one of the
`tst_flags` of settings.ini (as `nbdev_test` does), drops `#| hide` cells and directive lines,
and turns plotly outputs into `Plotly.newPlot` calls against ONE local copy of plotly.js
(`_docs/plotly.min.js`), so figures stay interactive with no kernel and no network. Maths
(`$...$`, `$$...$$`) is rendered at build time to MathML (latex2mathml), which browsers draw
natively: no MathJax, no CDN.
Machines with Quarto can still use `nbdev_docs` (nbs/_quarto.yml is kept valid).
"""
import argparse, configparser, copy, hashlib, html, json, os, re, shutil, sys, time
from pathlib import Path
import nbformat

ROOT = Path(__file__).resolve().parents[1]
_DIRECTIVE = re.compile(r'^\s*#\s*\|\s*(.*)$')
PLOTLY_MIME = 'application/vnd.plotly.v1+json'
_QUARTO_ATTRS = re.compile(r'\{(?:target|style|\.)[^}\n]*\}')  # Quarto link attributes in show_doc output

def tst_flags(root=ROOT):
    "The nbdev test flags (cells carrying one are skipped), from settings.ini."
    cfg = configparser.ConfigParser(); cfg.read(root/'settings.ini')
    return cfg['DEFAULT'].get('tst_flags', 'notest').split()

def directives(cell):
    "The nbdev directives (`#| ...` lines at the top of a code cell), as a list of word lists."
    out = []
    for line in cell.source.splitlines():
        m = _DIRECTIVE.match(line)
        if m: out.append(m.group(1).replace(':', ' ').split())
        elif line.strip(): break
    return out

def strip_directives(src):
    "Source without its leading `#| ...` directive lines."
    lines = src.splitlines(); i = 0
    while i < len(lines) and (_DIRECTIVE.match(lines[i]) or not lines[i].strip()): i += 1
    return '\n'.join(lines[i:])

def is_hidden(cell):
    return cell.cell_type == 'code' and any(d[:1] in (['hide'], ['exporti']) or d[:2] == ['include', 'false'] for d in directives(cell))

def is_echo_false(cell):
    "Cells marked `#| echo: false` show their output but not their source."
    return cell.cell_type == 'code' and any(d[:2] == ['echo', 'false'] for d in directives(cell))

def is_flagged(cell, flags):
    return cell.cell_type == 'code' and any(d[:1] and d[0] in flags for d in directives(cell))

def readme_text(nb_path=ROOT/'nbs'/'index.ipynb'):
    "README.md's text: the markdown of index.ipynb without hidden cells or directive lines."
    nb = nbformat.read(nb_path, as_version=4)
    parts = []
    for c in nb.cells:
        if c.cell_type == 'markdown': parts.append(c.source.strip())
        elif c.cell_type == 'code' and not is_hidden(c) and not is_echo_false(c) and strip_directives(c.source).strip():
            parts.append('```python\n' + strip_directives(c.source).strip() + '\n```')
    return '\n\n'.join(parts) + '\n'

_CODE = re.compile(r'(```.*?```|`[^`\n]*`)', re.S)                  # code spans and fences keep their dollars
_MATH = re.compile(r'\$\$(.+?)\$\$|(?<![\\$])\$(?!\s)([^$\n]+?)(?<!\s)\$(?!\d)', re.S)
_MATHJAX = re.compile(r'\s*<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->', re.S)

def math_to_placeholders(md, store):
    "Markdown with each `$...$` / `$$...$$` outside code replaced by a placeholder; `store` maps it to (MathML, plain text)."
    from latex2mathml.converter import convert
    def sub(m):
        key = f'TCMATH{len(store):05d}X'
        block = m.group(1) is not None
        tex = (m.group(1) if block else m.group(2)).strip()
        store[key] = (convert(tex, display='block' if block else 'inline'), re.sub(r'[^A-Za-z0-9]+', '', tex))
        return key
    parts = _CODE.split(md)
    return ''.join(p if i % 2 else _MATH.sub(sub, p) for i, p in enumerate(parts))

_PLACEHOLDER = re.compile(r'TCMATH\d{5}X')
_ATTR = re.compile(r'(=")([^"]*TCMATH\d{5}X[^"]*)(")')
_REMOTE_SCRIPT = re.compile(r'<script[^>]*src="https?://[^"]*"[^>]*>\s*</script>\s*')

def fill_maths(body, maths):
    "Placeholders become MathML in text, and plain text inside attributes (heading anchors and their links)."
    body = _ATTR.sub(lambda m: m.group(1) + _PLACEHOLDER.sub(lambda k: maths[k.group(0)][1], m.group(2)) + m.group(3), body)
    return _PLACEHOLDER.sub(lambda k: maths[k.group(0)][0], body)

def plotly_div(fig_json, index=0):
    "A div and a script that draw one plotly figure (the page's `index`-th) with the page's local plotly.js."
    div = f'plotly-{index}-{hashlib.sha1(json.dumps(fig_json, sort_keys=True).encode()).hexdigest()[:10]}'   # unique on the page
    payload = json.dumps({'data': fig_json.get('data', []), 'layout': fig_json.get('layout', {}),
                          'config': {'responsive': True, **fig_json.get('config', {})}})
    return (f'<div id="{div}" class="plotly-graph-div" style="width:100%;min-height:450px"></div>\n'
            f'<script>(function(){{var f={payload};Plotly.newPlot("{div}",f.data,f.layout,f.config);}})();</script>')

def _plotly_to_html(nb):
    n = 0
    for c in nb.cells:
        for o in c.get('outputs', []):
            data = o.get('data', {})
            if PLOTLY_MIME in data:
                o['data'] = {'text/html': plotly_div(data[PLOTLY_MIME], n)}; n += 1

def execute(nb, cwd, flags, timeout=1200):
    "Execute a notebook in `cwd`, skipping flagged cells; returns the executed copy."
    from nbclient import NotebookClient
    run = copy.deepcopy(nb)
    for c in run.cells:
        if is_flagged(c, flags): c.source = 'pass  # skipped: ' + ' '.join(sum(directives(c), []))
    env_before = os.environ.get('PLOTLY_RENDERER')
    os.environ['PLOTLY_RENDERER'] = 'plotly_mimetype'
    try: NotebookClient(run, timeout=timeout, kernel_name='python3',
                        resources={'metadata': {'path': str(cwd)}}).execute()
    finally:
        if env_before is None: os.environ.pop('PLOTLY_RENDERER', None)
        else: os.environ['PLOTLY_RENDERER'] = env_before
    for c, orig in zip(run.cells, nb.cells): c.source = orig.source
    return run

def page_name(nb_path): return Path(nb_path).stem + '.html'

def render(nb, title, nav, flags):
    "HTML for an executed notebook: hidden cells dropped, directives stripped, plotly made local."
    from nbconvert import HTMLExporter
    nb = copy.deepcopy(nb)
    nb.metadata.pop('widgets', None)          # widget state would load the widget manager from a CDN
    for c in nb.cells:                        # and so would widget views (progress bars): keep their text only
        for o in c.get('outputs', []):
            if 'application/vnd.jupyter.widget-view+json' in o.get('data', {}):
                o['data'] = {k: v for k, v in o['data'].items() if k == 'text/plain'}
    nb.cells = [c for c in nb.cells if not is_hidden(c) and not (c.cell_type == 'code' and not strip_directives(c.source).strip())]
    maths = {}
    for c in nb.cells:
        for o in c.get('outputs', []):
            md = o.get('data', {}).get('text/markdown')
            if md: o['data']['text/markdown'] = _QUARTO_ATTRS.sub('', md if isinstance(md, str) else ''.join(md))
        if is_echo_false(c): c.metadata['tags'] = [*c.metadata.get('tags', []), 'remove_input']   # before the directives go
        if c.cell_type == 'code': c.source = strip_directives(c.source)
        if c.cell_type == 'markdown':
            c.source = math_to_placeholders(re.sub(r'\(([\w./-]+)\.ipynb(#[\w-]*)?\)', r'(\1.html\2)', c.source), maths)
    _plotly_to_html(nb)
    from traitlets.config import Config
    cfg = Config(); cfg.TagRemovePreprocessor.remove_input_tags = {'remove_input'}; cfg.TagRemovePreprocessor.enabled = True
    body, _ = HTMLExporter(template_name='lab', config=cfg).from_notebook_node(nb, resources={'metadata': {'name': title}})
    body = _MATHJAX.sub('', body)                                    # maths is MathML already: no MathJax from a CDN
    body = fill_maths(body, maths)
    body = _REMOTE_SCRIPT.sub('', body)                              # require.js from a CDN: nothing here needs it
    head = '<script src="plotly.min.js"></script>\n'
    body = body.replace('<head>', '<head>\n' + head, 1)
    return re.sub(r'(<body[^>]*>)', lambda m: m.group(1) + '\n' + nav, body, count=1)

def nav_html(pages, current):
    links = ' | '.join(f'<b>{html.escape(t)}</b>' if p == current else f'<a href="{p}">{html.escape(t)}</a>' for p, t in pages)
    return f'<nav class="tc-nav" style="padding:8px 16px;border-bottom:1px solid #ddd;font-family:sans-serif;font-size:14px">{links}</nav>'

def notebook_title(nb, fallback):
    for c in nb.cells:
        if c.cell_type == 'markdown':
            m = re.search(r'^#\s+(.+)$', c.source, re.M)
            if m: return m.group(1).strip()
    return fallback

def build_html(nbs=ROOT/'nbs', out=ROOT/'_docs', only=None, execute_nbs=True, flags=None):
    "Execute and render every notebook of `nbs` (or those named in `only`) into `out`; returns the pages."
    import plotly
    flags = tst_flags() if flags is None else flags
    nbs, out = Path(nbs), Path(out)
    paths = sorted(p for p in nbs.glob('*.ipynb') if not p.name.startswith(('_', '.')))
    paths.sort(key=lambda p: (p.name != 'index.ipynb', p.name))
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(plotly.__file__).parent/'package_data'/'plotly.min.js', out/'plotly.min.js')
    nbs_read = [(p, nbformat.read(p, as_version=4)) for p in paths]
    pages = [(page_name(p), notebook_title(nb, p.stem)) for p, nb in nbs_read]          # every page in the navigation
    for (p, nb), (page, title) in zip(nbs_read, pages):
        if only and p.name not in only and p.stem not in only: continue
        t0 = time.time()
        if execute_nbs: nb = execute(nb, p.parent, flags)
        (out/page).write_text(render(nb, title, nav_html(pages, page), flags), encoding='utf-8')
        print(f'{p.name} -> {out/page} ({time.time()-t0:.1f}s)', flush=True)
    return [out/page_name(p) for p, _ in nbs_read if not only or p.name in only or p.stem in only]

CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser')
CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
                  '--disable-component-update', '--disable-sync', '--virtual-time-budget=15000']

def run_chromium_offline(page, *args, **kwargs):
    "Run headless Chromium on `page` with `args` and no network (own network namespace, or a dead proxy)."
    import subprocess
    cmd = [CHROMIUM, *CHROMIUM_FLAGS, *args, Path(page).resolve().as_uri()]
    if shutil.which('unshare') and subprocess.run(['unshare', '-n', 'true']).returncode == 0: cmd = ['unshare', '-n', *cmd]
    else: cmd += ['--proxy-server=http://127.0.0.1:9', '--proxy-bypass-list=<-loopback>']
    return subprocess.run(cmd, capture_output=True, timeout=120, **kwargs)

def screenshot(page, png, anchor=None, width=1280, height=2000):
    "PNG of `page` drawn by headless Chromium with no network; with `anchor`, from the cell holding that id onwards."
    page = Path(page).resolve()
    if anchor:
        s = page.read_text(encoding='utf-8')
        cells = [m.start() for m in re.finditer(r'<div[^>]*class="jp-Cell ', s)]
        at = s.index(f'id="{anchor}"')
        page = page.with_name(f'.shot-{page.name}')
        page.write_text(s[:cells[0]] + s[max(c for c in cells if c < at):], encoding='utf-8')
    run_chromium_offline(page, f'--window-size={width},{height}', f'--screenshot={Path(png).resolve()}', check=True)
    if anchor: page.unlink()

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest='cmd', required=True)
    r = sub.add_parser('readme'); r.add_argument('--check', action='store_true')
    h = sub.add_parser('html'); h.add_argument('notebooks', nargs='*'); h.add_argument('--out', default=str(ROOT/'_docs'))
    h.add_argument('--no-execute', action='store_true')
    sh = sub.add_parser('screenshot'); sh.add_argument('page'); sh.add_argument('png'); sh.add_argument('--from', dest='anchor')
    sh.add_argument('--height', type=int, default=2000)
    a = ap.parse_args()
    if a.cmd == 'readme':
        txt, fn = readme_text(), ROOT/'README.md'
        if a.check:
            ok = fn.exists() and fn.read_text(encoding='utf-8') == txt
            print('README.md is ' + ('in sync' if ok else 'OUT OF DATE: run python scripts/build_docs.py readme'))
            sys.exit(0 if ok else 1)
        fn.write_text(txt, encoding='utf-8'); print(f'wrote {fn}')
    elif a.cmd == 'screenshot': screenshot(a.page, a.png, a.anchor, height=a.height)
    else: build_html(out=a.out, only=a.notebooks or None, execute_nbs=not a.no_execute)
