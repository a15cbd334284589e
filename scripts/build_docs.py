"""Docs without Quarto: README.md from nbs/index.ipynb, and a static HTML site in _docs/.

    python scripts/build_docs.py readme            # write README.md from nbs/index.ipynb
    python scripts/build_docs.py readme --check    # exit 1 if README.md is out of date
    python scripts/build_docs.py html              # execute every notebook, render _docs/*.html
    python scripts/build_docs.py outputs           # execute every notebook, keep its text outputs in nbs/*.ipynb
    python scripts/build_docs.py screenshot _docs/07_explore.html shot.png --from The-static-twin

The HTML build executes each notebook with nbclient (one notebook per CPU core at a time), skipping cells that carry one of the
`tst_flags` of settings.ini (as `nbdev_test` does), drops `#| hide` cells and directive lines,
and turns plotly outputs into `Plotly.newPlot` calls against ONE local copy of plotly.js
(`_docs/plotly.min.js`), so figures stay interactive with no kernel and no network. Maths
(`$...$`, `$$...$$`) is rendered at build time to MathML (latex2mathml), which browsers draw
natively: no MathJax, no CDN.
Pages read like documentation: no In/Out prompts, a left sidebar with the reading order and a
table of contents per page, both taken from the root `_quarto.yml` (the one place the site's title
and navigation are written; Quarto renders the same file on machines that have it). A code cell
marked `#| fold` is drawn folded under a "Code" summary; exported cells that only import carry `#| hide`.
"""
import argparse, configparser, contextlib, copy, hashlib, html, json, os, re, shutil, sys, time
from pathlib import Path
import nbformat

ROOT = Path(__file__).resolve().parents[1]
_DIRECTIVE = re.compile(r'^\s*#\s*\|\s*(.*)$')
PLOTLY_MIME = 'application/vnd.plotly.v1+json'
_QUARTO_ATTRS = re.compile(r'\{(?:target|style|\.)[^}\n]*\}')  # Quarto link attributes in show_doc output

def site_config(path=ROOT/'_quarto.yml'):
    """The site's title and navigation from a Quarto project file: `(title, sections)`, where `sections` is a list of
    `(section title or None, [notebook paths])` in reading order, paths resolved against the file's folder."""
    import yaml
    path = Path(path)
    cfg = yaml.safe_load(path.read_text(encoding='utf-8'))
    site = cfg.get('website', {})
    sections, loose = [], []
    for entry in site.get('sidebar', {}).get('contents', []):
        if isinstance(entry, str): loose.append(path.parent/entry); continue
        if loose: sections.append((None, loose)); loose = []
        sections.append((entry['section'], [path.parent/e for e in entry.get('contents', [])]))
    if loose: sections.append((None, loose))
    return site.get('title', path.parent.name), sections

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

def is_folded(cell):
    """Cells marked `#| fold` are drawn with their source folded (an nbdev-style directive: nbdev_export drops it, where
    Quarto's `#| code-fold: true` would be copied into the module)."""
    return cell.cell_type == 'code' and any(d[:1] == ['fold'] or d[:2] == ['code-fold', 'true'] for d in directives(cell))

def is_flagged(cell, flags):
    return cell.cell_type == 'code' and any(d[:1] and d[0] in flags for d in directives(cell))

def readme_text(nb_path=ROOT/'nbs'/'index.ipynb'):
    """README.md's text: the markdown of index.ipynb without hidden cells or directive lines; links to notebooks and
    images are rewritten to their place in the repository (`nbs/...`), so they work where README.md is shown."""
    nb = nbformat.read(nb_path, as_version=4)
    parts = []
    for c in nb.cells:
        if c.cell_type == 'markdown': parts.append(c.source.strip())
        elif c.cell_type == 'code' and not is_hidden(c) and not is_echo_false(c) and strip_directives(c.source).strip():
            parts.append('```python\n' + strip_directives(c.source).strip() + '\n```')
    return _NB_TARGET.sub(r'](nbs/\1', '\n\n'.join(parts)) + '\n'

_NB_TARGET = re.compile(r'\]\(((?:images/[^)\s]+)|(?:[\w-]+\.ipynb))')

_CODE = re.compile(r'(```.*?```|`[^`\n]*`)', re.S)                  # code spans and fences keep their dollars
_MATH = re.compile(r'\$\$(.+?)\$\$|(?<![\\$])\$(?!\s)((?:[^$\n]|\n(?!\s*\n))+?)(?<!\s)\$(?!\d)', re.S)   # inline maths may wrap a line
_MATHJAX = re.compile(r'\s*<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->', re.S)

def _group(tex, i):
    "The end of the braced group (or single token) starting at `tex[i]`."
    if tex[i] == '\\': return i + len(re.match(r'\\[A-Za-z]+|\\.', tex[i:]).group(0))   # a command: \name or \x
    if tex[i] != '{': return i + 1
    depth = 0
    for j in range(i, len(tex)):
        depth += {'{': 1, '}': -1}.get(tex[j], 0)
        if depth == 0: return j + 1
    raise ValueError(f'unbalanced braces in {tex!r}')

def labelled_braces(tex):
    "`\\overbrace{A}^{B}` and `\\underbrace{A}_{B}` as `\\overset` / `\\underset`: MathML draws no stretched brace, so the label sits above or below."
    for cmd, mark, to in (('\\overbrace', '^', '\\overset'), ('\\underbrace', '_', '\\underset')):
        while (i := tex.find(cmd + '{')) >= 0:
            a0 = i + len(cmd); a1 = _group(tex, a0)
            if tex[a1:a1 + 1] != mark: tex = tex[:i] + tex[a0:a1] + tex[a1:]; continue
            b1 = _group(tex, a1 + 1)
            label = tex[a1 + 2:b1 - 1] if tex[a1 + 1] == '{' else tex[a1 + 1:b1]
            tex = f'{tex[:i]}{to}{{{label}}}{{{tex[a0 + 1:a1 - 1]}}}{tex[b1:]}'
    return tex

def math_to_placeholders(md, store):
    "Markdown with each `$...$` / `$$...$$` outside code replaced by a placeholder; `store` maps it to (MathML, plain text)."
    from latex2mathml.converter import convert
    def sub(m):
        key = f'TCMATH{len(store):05d}X'
        block = m.group(1) is not None
        tex = (m.group(1) if block else m.group(2)).strip()
        store[key] = (convert(labelled_braces(tex), display='block' if block else 'inline'), re.sub(r'[^A-Za-z0-9]+', '', tex))
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

_SHOW_DOC = re.compile(r'^(show_doc\(.*\))\s*$')

def is_show_doc(cell):
    "Cells of `show_doc(...)` lines only: the page shows the documentation they render, not the call."
    lines = strip_directives(cell.source).splitlines() if cell.cell_type == 'code' else []
    return bool(lines) and all(_SHOW_DOC.match(l) for l in lines)

def _display_each_show_doc(src):
    "A cell of several `show_doc(...)` lines shows each one (as nbdev's docs do), not only the last."
    lines = strip_directives(src).splitlines()
    if len(lines) < 2 or not all(_SHOW_DOC.match(l) for l in lines): return src
    return '\n'.join(f'display({l.strip()})' for l in lines)

def execute(nb, cwd, flags, timeout=1200):
    "Execute a notebook in `cwd`, skipping flagged cells; returns the executed copy."
    from nbclient import NotebookClient
    run = copy.deepcopy(nb)
    for c in run.cells:
        if is_flagged(c, flags): c.source = 'pass  # skipped: ' + ' '.join(sum(directives(c), []))
        elif c.cell_type == 'code': c.source = _display_each_show_doc(c.source)
    client = NotebookClient(run, timeout=timeout, kernel_name='python3', resources={'metadata': {'path': str(cwd)}})
    # No imitation of the frontend's Output widget: nbclient routes a cell's own messages to an Output widget while it
    # is entered, and when that routing outlives the `with` block the cell's final status is swallowed and the run
    # waits for the cell timeout (seen with the explorer). Widget outputs are not rendered on the static site anyway.
    client.comm_open_handlers = {}
    client.execute(env=dict(os.environ, PLOTLY_RENDERER='plotly_mimetype'))     # the kernel's environment only
    for c, orig in zip(run.cells, nb.cells): c.source = orig.source
    return run

TEXT_MIMES = ('text/plain', 'text/markdown', 'text/html')
_FIGURE_MIMES = (PLOTLY_MIME, 'application/vnd.jupyter.widget-view+json', 'image/png', 'image/svg+xml', 'image/jpeg')

def text_outputs(outputs):
    """The outputs worth committing: stdout text, results and displays in text form (tables, show_doc, printed numbers).
    Figures, widgets and images are drawn at build time only; stderr (warnings, progress bars) is dropped."""
    keep = []
    for o in outputs:
        if o.output_type == 'stream':
            if o.name == 'stdout': keep.append(o)
        elif o.output_type in ('execute_result', 'display_data'):
            if any(m in o.data for m in _FIGURE_MIMES): continue
            data = {m: v for m, v in o.data.items() if m in TEXT_MIMES}
            if data: keep.append(nbformat.from_dict({**o, 'data': data, 'metadata': {}}))
    return keep

def save_text_outputs(nb_path, flags=None):
    "Execute one notebook (flagged cells skipped) and write its text outputs back into it; sources are left as they were."
    nb_path = Path(nb_path)
    nb, flags = nbformat.read(nb_path, as_version=4), tst_flags() if flags is None else flags
    run = execute(nb, nb_path.parent, flags)
    for c, r in zip(nb.cells, run.cells):
        if c.cell_type == 'code': c.outputs = [] if is_flagged(c, flags) else text_outputs(r.outputs)
    nb.metadata.pop('widgets', None)
    nbformat.write(nb, nb_path)

def page_name(nb_path): return Path(nb_path).stem + '.html'

def is_stderr_or_widget(o) -> bool:
    "An output the static site leaves out: stderr text (warnings, progress bars) or a widget view (live in Jupyter only, a repr here)."
    return (o.get('output_type') == 'stream' and o.get('name') == 'stderr') or 'application/vnd.jupyter.widget-view+json' in o.get('data', {})

def render(nb, title, nav, flags, pager='', api=None, page=''):
    "HTML for an executed notebook: hidden cells dropped, directives stripped, plotly made local; `pager` ends the page."
    from nbconvert import HTMLExporter
    nb = copy.deepcopy(nb)
    nb.metadata.pop('widgets', None)          # widget state would load the widget manager from a CDN
    for c in nb.cells:                        # and so would widget views; stderr (warnings, progress bars) is not page content
        if c.cell_type == 'code': c.outputs = [o for o in c.outputs if not is_stderr_or_widget(o)]
    nb.cells = [c for c in nb.cells if not is_hidden(c) and not (c.cell_type == 'code' and not strip_directives(c.source).strip())]
    maths = {}
    for c in nb.cells:
        for o in c.get('outputs', []):
            md = o.get('data', {}).get('text/markdown')
            if md: o['data']['text/markdown'] = math_to_placeholders(_QUARTO_ATTRS.sub('', md if isinstance(md, str) else ''.join(md)), maths)
        if is_echo_false(c) or is_show_doc(c): c.metadata['tags'] = [*c.metadata.get('tags', []), 'remove_input']   # before the directives go
        if is_folded(c): c.metadata['tags'] = [*c.metadata.get('tags', []), 'tc-fold']
        if c.cell_type == 'code': c.source = strip_directives(c.source)
        if c.cell_type == 'markdown':
            c.source = math_to_placeholders(re.sub(r'\(([\w./-]+)\.ipynb(#[^)\s]*)?\)', r'(\1.html\2)', c.source), maths)
    _plotly_to_html(nb)
    from traitlets.config import Config
    cfg = Config(); cfg.TagRemovePreprocessor.remove_input_tags = {'remove_input'}; cfg.TagRemovePreprocessor.enabled = True
    body, _ = HTMLExporter(template_name='lab', config=cfg, exclude_input_prompt=True, exclude_output_prompt=True
                           ).from_notebook_node(nb, resources={'metadata': {'name': title}})
    body = _MATHJAX.sub('', body)                                    # maths is MathML already: no MathJax from a CDN
    body = fill_maths(body, maths)
    if api: body = link_api_names(body, api, page)
    body = _REMOTE_SCRIPT.sub('', body)                              # require.js from a CDN: nothing here needs it
    head = f'<script src="plotly.min.js"></script>\n<style>{SITE_CSS}</style>\n'
    body = body.replace('<head>', '<head>\n' + head, 1)
    body = body.replace('</body>', f'{pager}\n<script>{FOLD_JS}</script>\n</body>', 1)
    return re.sub(r'(<body[^>]*>)', lambda m: m.group(1) + '\n' + nav + '\n' + toc_html(body), body, count=1)

SITE_CSS = """
body.jp-Notebook { margin: 0 250px 0 290px; padding: 20px 28px 60px; max-width: 1000px; }
.tc-nav { position: fixed; top: 0; left: 0; bottom: 0; width: 270px; overflow-y: auto; padding: 16px 14px;
          background: #f7f7f9; border-right: 1px solid #ddd; font: 14px/1.45 system-ui, sans-serif; }
.tc-nav .tc-site { display: block; font-size: 17px; font-weight: 600; margin-bottom: 12px; color: #222; text-decoration: none; }
.tc-nav .tc-section { margin: 14px 0 4px; color: #666; font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.tc-nav a, .tc-toc a, .tc-pager a { color: #2a5db0; text-decoration: none; }
.tc-pager { display: flex; justify-content: space-between; margin: 40px 0 0; padding-top: 14px; border-top: 1px solid #ddd;
            font: 15px/1.45 system-ui, sans-serif; }
.tc-nav li, .tc-toc li { list-style: none; margin: 3px 0; }
.tc-nav ul, .tc-toc ul { padding-left: 0; margin: 0; }
.tc-nav .tc-current { font-weight: 600; color: #111; }
.tc-toc { position: fixed; top: 0; right: 0; width: 230px; max-height: 100vh; overflow-y: auto; padding: 16px 12px;
          border-left: 1px solid #eee; font: 13px/1.4 system-ui, sans-serif; }
.tc-toc .tc-toc-title { font-weight: 600; margin-bottom: 6px; }
.tc-toc li.tc-h3 { padding-left: 12px; }
details.tc-fold > summary { cursor: pointer; color: #555; font: 13px system-ui, sans-serif; padding: 2px 0; }
/* `body.jp-Notebook` outranks the lab template's own rules for these, which come later in the page */
body.jp-Notebook .jp-InputArea-editor, body.jp-Notebook .jp-InputArea-editor .highlight, body.jp-Notebook .jp-InputArea-editor pre { overflow-x: auto; }
body.jp-Notebook .jp-InputArea-editor pre { white-space: pre-wrap; word-break: normal; overflow-wrap: normal; max-width: 100ch; font-size: 12.5px; }   /* code wraps at spaces near 100 columns */
body.jp-Notebook .jp-OutputArea-output pre { white-space: pre; word-break: normal; overflow-wrap: normal; overflow-x: auto; font-size: 12.5px; }
math[display="block"] { display: block; max-width: 100%; overflow-x: auto; overflow-y: hidden; padding: 4px 0; }
@media (max-width: 1250px) { .tc-toc { display: none; } body.jp-Notebook { margin-right: 0; } }
@media (max-width: 800px) { .tc-nav { position: static; width: auto; border: 0; } body.jp-Notebook { margin-left: 0; } }
"""

FOLD_JS = """document.querySelectorAll('.celltag_tc-fold .jp-Cell-inputWrapper').forEach(function (w) {
  var d = document.createElement('details'), s = document.createElement('summary');
  d.className = 'tc-fold'; s.textContent = 'Code'; d.appendChild(s); w.parentNode.insertBefore(d, w); d.appendChild(w); });"""

def pager_html(sections, current):
    "Links to the previous and the next page in reading order, for the foot of a page."
    order = [(p, t) for _, pages in sections for p, t in pages]
    i = [p for p, _ in order].index(current)
    prev = f'<a class="tc-prev" href="{order[i - 1][0]}">&larr; {html.escape(order[i - 1][1])}</a>' if i > 0 else '<span></span>'
    nxt = f'<a class="tc-next" href="{order[i + 1][0]}">{html.escape(order[i + 1][1])} &rarr;</a>' if i + 1 < len(order) else '<span></span>'
    return f'<nav class="tc-pager">{prev}{nxt}</nav>'

def nav_html(site_title, sections, current):
    "The left sidebar: the site's title, then each section's pages in reading order, the current one marked."
    out = [f'<nav class="tc-nav"><a class="tc-site" href="index.html">{html.escape(site_title)}</a>']
    for name, pages in sections:
        if name: out.append(f'<div class="tc-section">{html.escape(name)}</div>')
        out.append('<ul>' + ''.join(f'<li class="tc-current">{html.escape(t)}</li>' if p == current else
                                    f'<li><a href="{p}">{html.escape(t)}</a></li>' for p, t in pages) + '</ul>')
    return '\n'.join(out) + '</nav>'

_HEADING = re.compile(r'<h([23]) id="([^"]+)">(.*?)<a class="anchor-link"', re.S)
_MARKDOWN_CELL = re.compile(r'<div[^>]*class="jp-Cell jp-MarkdownCell.*?(?=<div[^>]*class="jp-Cell |\Z)', re.S)

_SHOW_DOC_NAME = re.compile(r'show_doc\(\s*([A-Za-z_][\w.]*)')
_CODE_NAME = re.compile(r'<code>([A-Za-z_][\w.]*)(\(\))?</code>')

NOT_LINKED = {'phase1', 'phase2'}   # also the names of initialisations (`init='phase1'`), which the prose means more often

def api_index(notebooks: dict) -> dict:
    "Every name a notebook documents with `show_doc`: name -> (its page, the anchor of its documentation)."
    index = {}
    for p, nb in notebooks.items():
        for c in nb.cells:
            if c.cell_type == 'code' and is_show_doc(c):
                for name in set(_SHOW_DOC_NAME.findall(c.source)) - NOT_LINKED: index.setdefault(name, (page_name(p), name))
    return index

_LINK_OR_CODE_NAME = re.compile(r'(<a\b.*?</a>)|' + _CODE_NAME.pattern, re.S)   # an existing link is left as it is

def link_api_names(body, index, page):
    "In the prose of `body` (the page `page`), each `name` in code font that a notebook documents links to its documentation."
    def link(m):
        if m.group(1) or m.group(2) not in index: return m.group(0)
        target, anchor = index[m.group(2)]
        return f'<a class="tc-api" href="{"" if target == page else target}#{anchor}">{m.group(0)}</a>'
    return _MARKDOWN_CELL.sub(lambda cell: _LINK_OR_CODE_NAME.sub(link, cell.group(0)), body)

def toc_html(body):
    "The page's table of contents: a link to every second- and third-level heading of its prose (not of the API docs)."
    prose = ''.join(m.group(0) for m in _MARKDOWN_CELL.finditer(body))
    items = [f'<li class="tc-h{lvl}"><a href="#{hid}">{text}</a></li>' for lvl, hid, text in _HEADING.findall(prose)]
    return f'<nav class="tc-toc"><div class="tc-toc-title">On this page</div><ul>{"".join(items)}</ul></nav>' if items else ''

def notebook_title(nb, fallback):
    for c in nb.cells:
        if c.cell_type == 'markdown':
            m = re.search(r'^#\s+(.+)$', c.source, re.M)
            if m: return m.group(1).strip()
    return fallback

def site_pages(nbs, config=None):
    """`(site title, sections)` for the notebooks of `nbs`: from `config` (a Quarto project file) when given, every
    notebook of `nbs` once and nothing else; otherwise one untitled section of all notebooks, index first."""
    nbs = Path(nbs)
    found = sorted(p for p in nbs.glob('*.ipynb') if not p.name.startswith(('_', '.')))
    if config is None:
        found.sort(key=lambda p: (p.name != 'index.ipynb', p.name))
        return nbs.parent.name, [(None, found)]
    title, sections = site_config(config)
    listed = [p.resolve() for _, ps in sections for p in ps]
    missing = sorted({p.name for p in found} - {p.name for p in listed})
    absent = [p.name for p in listed if not p.exists()]
    if missing or absent or len(listed) != len(set(listed)):
        raise ValueError(f'{config}: its sidebar must list every notebook of {nbs} once; not listed: {missing}, '
                         f'listed but missing: {absent}')
    return title, sections

def build_html(nbs=ROOT/'nbs', out=ROOT/'_docs', only=None, execute_nbs=True, flags=None, config=None):
    """Execute and render every notebook of `nbs` (or those named in `only`) into `out`; returns the pages.
    The navigation comes from `config` (default: the root `_quarto.yml` when `nbs` is the package's own notebooks)."""
    import plotly
    flags = tst_flags() if flags is None else flags
    nbs, out = Path(nbs), Path(out)
    if config is None and nbs.resolve() == (ROOT/'nbs').resolve(): config = ROOT/'_quarto.yml'
    site_title, sections = site_pages(nbs, config)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(plotly.__file__).parent/'package_data'/'plotly.min.js', out/'plotly.min.js')
    if (nbs/'images').is_dir(): shutil.copytree(nbs/'images', out/'images', dirs_exist_ok=True)
    read = {p: nbformat.read(p, as_version=4) for _, ps in sections for p in ps}
    nav = [(name, [(page_name(p), 'Overview' if p.stem == 'index' else notebook_title(read[p], p.stem)) for p in ps]) for name, ps in sections]
    api, done, t0 = api_index(read), [], time.time()
    todo = [p for p in read if not only or p.name in only or p.stem in only]
    with executed_in_order(todo, read, flags, execute_nbs) as executed:
        for p, nb in zip(todo, executed):
            page = page_name(p)
            (out/page).write_text(render(nb, notebook_title(nb, p.stem), nav_html(site_title, nav, page), flags, pager_html(nav, page), api, page),
                                  encoding='utf-8')
            print(f'{p.name} -> {out/page} ({time.time()-t0:.0f}s into the build)', flush=True)
            done.append(out/page)
    return done

@contextlib.contextmanager
def executed_in_order(paths, read, flags, execute_nbs=True, workers=None):
    """The notebooks `read[p]` for `p` in `paths`, in that order, each executed in its own kernel (as is, without
    `execute_nbs`): `workers` notebooks at a time (default: one per CPU core), each in its own process."""
    workers = min(workers or os.cpu_count() or 1, len(paths))
    if not execute_nbs or workers <= 1:
        yield (execute(read[p], p.parent, flags) if execute_nbs else read[p] for p in paths); return
    from concurrent.futures import ProcessPoolExecutor
    pool = ProcessPoolExecutor(workers)
    try: yield pool.map(execute, [read[p] for p in paths], [p.parent for p in paths], [flags] * len(paths))
    finally: pool.shutdown(cancel_futures=True)

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
    o = sub.add_parser('outputs'); o.add_argument('notebooks', nargs='*')
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
    elif a.cmd == 'outputs':
        import subprocess
        for p in sorted((ROOT/'nbs').glob('*.ipynb')):
            if a.notebooks and p.name not in a.notebooks and p.stem not in a.notebooks: continue
            t0 = time.time(); save_text_outputs(p)
            subprocess.run(['nbdev_clean', '--fname', str(p)], cwd=ROOT, check=True)
            print(f'{p.name}: text outputs saved ({time.time() - t0:.0f}s)', flush=True)
    else: build_html(out=a.out, only=a.notebooks or None, execute_nbs=not a.no_execute)
