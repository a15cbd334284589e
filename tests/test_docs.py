"The fallback docs build: executed notebooks as static HTML whose plotly figures draw offline."
import re
from urllib.parse import unquote
import nbformat, pytest
from conftest import ROOT
import build_docs

CHROMIUM = build_docs.CHROMIUM

def offline_dom(page, tmp_path):
    "The DOM of `page` after scripts ran in headless Chromium with no network."
    return build_docs.run_chromium_offline(page, f'--user-data-dir={tmp_path/"profile"}', '--dump-dom', text=True).stdout

@pytest.fixture(scope='module')
def site(tmp_path_factory):
    d = tmp_path_factory.mktemp('docs')
    nbs, out = d/'nbs', d/'_docs'
    nbs.mkdir()
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell('# A figure\n\n> subtitle\n\nSee [the other page](b_page.ipynb).'),
        nbformat.v4.new_code_cell('#| hide\nSECRET = 1'),
        nbformat.v4.new_code_cell('#| slow\nraise RuntimeError("slow cells are skipped")'),
        nbformat.v4.new_code_cell('import plotly.graph_objects as go\ngo.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2]))'),
        nbformat.v4.new_code_cell('go.Figure(go.Bar(x=["a", "b"], y=[1, 2]))'),
        nbformat.v4.new_code_cell('#| echo: false\nECHO_FALSE_SOURCE = 1\nprint("echo-false output")'),
        nbformat.v4.new_code_cell('#| export\n#| fold\nFOLDED_SOURCE = 1'),
        nbformat.v4.new_code_cell('from IPython.display import Markdown\nMarkdown("A docstring with $y_t$ in it")'),
        nbformat.v4.new_code_cell('def show_doc(name): return Markdown(f"DOC-{name}")'),
        nbformat.v4.new_code_cell('show_doc("first")\nshow_doc("second")'),
        nbformat.v4.new_code_cell('import sys, warnings\nprint("STDOUT" + "-KEPT"); print("STDERR" + "-DROPPED", file=sys.stderr)\n'
                                  'warnings.warn("WARNING" + "-DROPPED")\nfrom tqdm.auto import tqdm\nfor _ in tqdm(range(3), desc="PROGRESS" + "-DROPPED"): pass'),
        nbformat.v4.new_markdown_cell('## A section\n\nText.\n\n### A subsection'),
        nbformat.v4.new_markdown_cell('Inline $x^2$ and display $$\\sum_s v_s k_s^\\top$$ maths; `$not maths$` in code.')])
    nbformat.write(nb, nbs/'a_page.ipynb')
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell('# Other')]), nbs/'b_page.ipynb')
    pages = build_docs.build_html(nbs, out, flags=['notest', 'slow'])
    return out, pages

def test_pages_use_one_local_plotly(site):
    out, pages = site
    html = (out/'a_page.html').read_text()
    assert (out/'plotly.min.js').exists() and len(list(out.rglob('plotly*.js'))) == 1
    assert html.count('<script src="plotly.min.js"></script>') == 1
    assert html.count('Plotly.newPlot') == 2 and 'cdn.plot.ly' not in html
    ids = re.findall(r'id="(plotly-[^"]+)"', html)
    assert len(ids) == len(set(ids)) == 2, 'each figure needs its own div id'
    assert 'plotly.js v' not in html, 'plotly.js must not be inlined into the page'
    assert 'SECRET' not in html and '#| hide' not in html, 'hidden cells are dropped'
    assert 'ECHO_FALSE_SOURCE' not in html and 'echo-false output' in html, 'echo: false cells show their output only'
    assert html.count('<math') == 3 and 'display="block"' in html and '$not maths$' in html, \
        'maths is MathML (in markdown cells and in markdown outputs such as show_doc), code spans are left alone'
    assert 'href="b_page.html"' in html and 'href="a_page.html"' in (out/'b_page.html').read_text()
    assert 'class="jp-InputPrompt' not in html and 'In&nbsp;[' not in html, 'no In/Out prompts'
    assert 'DOC-first' in html and 'DOC-second' in html, 'a cell of several show_doc calls shows each'
    assert 'STDOUT-KEPT' in html and not re.search('STDERR-DROPPED|WARNING-DROPPED|PROGRESS-DROPPED|it/s', html), \
        'printed text stays; stderr (warnings, progress bars) and widget views are left out'
    assert 'celltag_tc-fold' in html and 'FOLDED_SOURCE' in html, 'a folded cell keeps its source, marked for folding'
    toc = re.search(r'<nav class="tc-toc">.*?</nav>', html, re.S).group(0)
    assert 'href="#A-section"' in toc and 'class="tc-h3"' in toc, 'the table of contents lists the page headings'
    assert 'show_doc(&quot;first&quot;)' not in html and 'show_doc("first")' not in html, 'show_doc calls show their documentation only'
    pager = re.search(r'<nav class="tc-pager">.*?</nav>', html, re.S).group(0)
    assert 'href="b_page.html"' in pager and 'tc-prev' not in pager, 'the foot of a page links the next page in reading order'

def test_the_table_of_contents_lists_the_prose_headings_only(tmp_path):
    nbs = tmp_path/'nbs'; nbs.mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell('# Page\n\n## Prose section'),
        nbformat.v4.new_code_cell('from IPython.display import Markdown\nMarkdown("### api_function\\n\\nits documentation")')]), nbs/'p.ipynb')
    build_docs.build_html(nbs, tmp_path/'_docs', flags=[])
    html = (tmp_path/'_docs'/'p.html').read_text()
    toc = re.search(r'<nav class="tc-toc">.*?</nav>', html, re.S).group(0)
    assert 'Prose section' in toc and 'api_function' not in toc and 'api_function' in html

def test_navigation_from_the_quarto_project(tmp_path):
    (tmp_path/'nbs').mkdir()
    for n in ('index', '00_a', '70_b'):
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f'# Page {n}')]), tmp_path/'nbs'/f'{n}.ipynb')
    cfg = tmp_path/'_quarto.yml'
    cfg.write_text('website:\n  title: "Site"\n  sidebar:\n    contents:\n      - nbs/index.ipynb\n'
                   '      - section: "The method"\n        contents: [nbs/00_a.ipynb]\n'
                   '      - section: "Appendix"\n        contents: [nbs/70_b.ipynb]\n')
    title, sections = build_docs.site_pages(tmp_path/'nbs', cfg)
    assert title == 'Site' and [(n, [p.name for p in ps]) for n, ps in sections] == \
        [(None, ['index.ipynb']), ('The method', ['00_a.ipynb']), ('Appendix', ['70_b.ipynb'])]
    out = tmp_path/'_docs'
    build_docs.build_html(tmp_path/'nbs', out, execute_nbs=False, config=cfg)
    nav = re.search(r'<nav class="tc-nav">.*?</nav>', (out/'00_a.html').read_text(), re.S).group(0)
    assert nav.index('The method') < nav.index('Page 00_a') < nav.index('Appendix') < nav.index('href="70_b.html"')
    assert 'class="tc-current">Page 00_a' in nav and 'href="index.html">Overview' in nav
    nbformat.write(nbformat.v4.new_notebook(), tmp_path/'nbs'/'71_c.ipynb')          # a notebook the sidebar forgot
    with pytest.raises(ValueError, match='71_c.ipynb'): build_docs.site_pages(tmp_path/'nbs', cfg)

def test_the_site_navigation_lists_every_notebook():
    title, sections = build_docs.site_pages(ROOT/'nbs', ROOT/'_quarto.yml')
    names = [n for n, _ in sections]
    assert title == 'taylor-calibrate' and names.index('The method') < names.index('Appendix')
    appendix = [p.name for n, ps in sections if n == 'Appendix' for p in ps]
    assert appendix and all(int(a[:2]) >= 70 for a in appendix), 'the appendix comes after the pipeline'

FIGURE_MIMES = ('application/vnd.plotly.v1+json', 'application/vnd.jupyter.widget-view+json', 'image/png')

@pytest.mark.parametrize('nb_path', sorted((ROOT/'nbs').glob('*.ipynb')), ids=lambda p: p.name)
def test_committed_notebooks_keep_text_outputs(nb_path):
    "The committed notebooks read on a code host: text outputs kept (show_doc included), figures and widgets left to the build."
    nb = nbformat.read(nb_path, as_version=4)
    flags = build_docs.tst_flags()
    code = [c for c in nb.cells if c.cell_type == 'code' and not build_docs.is_flagged(c, flags)]
    for c in code:
        for o in c.outputs:
            assert not any(m in o.get('data', {}) for m in FIGURE_MIMES), f'{nb_path.name}: a figure or widget output is committed'
    docs = [c for c in code if c.source.lstrip().startswith('show_doc(')]
    assert all(c.outputs for c in docs), f'{nb_path.name}: show_doc cells without their output (python scripts/build_docs.py outputs)'
    printed = [c for c in code if re.search(r'^print\(', c.source, re.M) and not build_docs.is_hidden(c)]
    assert all(c.outputs for c in printed), f'{nb_path.name}: cells that print without their output (python scripts/build_docs.py outputs)'

@pytest.mark.skipif(CHROMIUM is None, reason='Chromium is not installed (apt-get install chromium); .ci/run installs it')
def test_figures_draw_offline_in_chromium(site, tmp_path):
    out, _ = site
    dom = offline_dom(out/'a_page.html', tmp_path)
    assert dom.count('class="main-svg"') >= 2, 'plotly did not draw both figures offline'
    assert dom.count('<details class="tc-fold">') == 1, 'the folded cell is drawn folded'

# ----- the real site: every notebook executed and rendered, then crawled offline -----
HREF = re.compile(r'(?:href|src)="([^"]*)"')

@pytest.fixture(scope='module')
def real_site(tmp_path_factory):
    out = tmp_path_factory.mktemp('site')/'_docs'
    build_docs.build_html(ROOT/'nbs', out)
    return out

def internal_links(html):
    "Relative link targets of a page (file, anchor); external and data links are left out."
    return [tuple((u.split('#', 1) + [''])[:2]) for u in HREF.findall(html) if u and not re.match(r'^[a-z][a-z0-9+.-]*:', u)]

def test_site_links_and_resources(real_site):
    pages = sorted(real_site.glob('*.html'))
    assert {p.stem for p in pages} == {p.stem for p in (ROOT/'nbs').glob('*.ipynb')}, 'one page per notebook'
    for page in pages:
        html = page.read_text()
        assert not re.search(r'<script[^>]*src="https?:', html), f'{page.name} loads a script from the network'
        assert not re.search(r'data-mime-type="application/vnd\.jupyter\.stderr"|\d+%\|[^|]*\| *\d+/\d+ \[', html), \
            f'{page.name} shows stderr or a progress bar'
        assert 'TCMATH' not in html and 'mathjax' not in html.lower(), f'{page.name}: maths not rendered to MathML'
        for target, anchor in internal_links(html):
            dest = real_site/target if target else page
            assert dest.exists(), f'{page.name} links to missing {target}'
            if anchor and dest.suffix == '.html':     # as a browser matches a fragment: as written, else percent-decoded
                text = dest.read_text()
                assert any(f'id="{a}"' in text for a in (anchor, unquote(anchor))), f'{page.name} links to missing anchor {target}#{anchor}'

@pytest.mark.skipif(CHROMIUM is None, reason='Chromium is not installed (apt-get install chromium); .ci/run installs it')
def test_site_draws_offline(real_site, tmp_path):
    for page in sorted(real_site.glob('*.html')):
        html, dom = page.read_text(), offline_dom(page, tmp_path)
        assert 'tc-nav' in dom, f'{page.name} did not load'
        n = html.count('class="plotly-graph-div"')
        assert dom.count('class="plot-container plotly"') == n, f'{page.name}: not all of its {n} plotly figures drew offline'
        assert dom.count('<math') == html.count('<math'), f'{page.name}: maths lost in the browser'

# The method path: a reader following the sidebar reaches Phase 1's first mapping within a short read.
FIRST_MAPPING = ('05_calibrate.ipynb', '## Phase 1, one mapping at a time')
METHOD_PATH_WORDS = 5000

def prose_words(markdown: str) -> int:
    "Words of prose in a markdown cell: fenced code, display maths, HTML and table rows left out."
    text = re.sub(r'```.*?```', ' ', markdown, flags=re.S)
    text = re.sub(r'<!--.*?-->|\$\$.*?\$\$', ' ', text, flags=re.S)
    text = re.sub(r'<[^>]+>', ' ', text)
    return sum(len(line.split()) for line in text.split('\n') if not line.lstrip().startswith('|'))

def words_before_first_mapping() -> tuple[int, list]:
    "Prose words a reader passes in sidebar order before Phase 1's first mapping, and the pages passed."
    _, sections = build_docs.site_pages(ROOT/'nbs', ROOT/'_quarto.yml')
    total, passed = 0, []
    for page in [p for _, ps in sections for p in ps]:
        for cell in nbformat.read(page, as_version=4).cells:
            if cell.cell_type != 'markdown': continue
            if page.name == FIRST_MAPPING[0] and FIRST_MAPPING[1] in cell.source:
                return total + prose_words(cell.source[:cell.source.index(FIRST_MAPPING[1])]), passed + [page.name]
            total += prose_words(cell.source)
        passed.append(page.name)
    raise AssertionError(f'{FIRST_MAPPING[1]!r} is not in {FIRST_MAPPING[0]}')

def test_prose_words():
    assert prose_words('One two.\n\n```py\nx = 1\n```\n\n| a | b |\n|---|---|\n\n$$x^2$$ three <b>four</b>') == 4

def test_the_method_path_reaches_phase_1_within_a_short_read():
    words, passed = words_before_first_mapping()
    assert passed == ['index.ipynb', '00_taylor.ipynb', '01_gdn.ipynb', '05_calibrate.ipynb'], passed
    assert words < METHOD_PATH_WORDS, f'{words} words of prose before Phase 1\'s first mapping (at most {METHOD_PATH_WORDS})'

def test_exported_names_in_prose_link_to_their_documentation():
    pages = {ROOT/'nbs'/'a.ipynb': nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('show_doc(calibrate)\nshow_doc(Report.to_frame)'),
                                                                   nbformat.v4.new_code_cell('show_doc(phase1)')])}
    index = build_docs.api_index(pages)
    assert index == {'calibrate': ('a.html', 'calibrate'), 'Report.to_frame': ('a.html', 'Report.to_frame')}   # phase1 is also an init
    body = ('<div class="jp-Cell jp-MarkdownCell"><p><code>calibrate()</code>, <code>Report.to_frame</code>, <code>other</code>, '
            '<a href="x.html"><code>calibrate</code></a></p></div><div class="jp-Cell jp-CodeCell"><code>calibrate</code></div>')
    linked = build_docs.link_api_names(body, index, 'b.html')
    assert '<a class="tc-api" href="a.html#calibrate"><code>calibrate()</code></a>' in linked
    assert '<a class="tc-api" href="a.html#Report.to_frame"><code>Report.to_frame</code></a>' in linked
    assert '<code>other</code>,' in linked and '<a href="x.html"><code>calibrate</code></a>' in linked   # unknown or linked already
    assert linked.endswith('<div class="jp-Cell jp-CodeCell"><code>calibrate</code></div>')            # prose only
    assert 'href="#calibrate"' in build_docs.link_api_names(body, index, 'a.html')                      # same page: the anchor alone

def test_labelled_braces_become_over_and_under_labels():
    assert build_docs.labelled_braces(r'\frac{\overbrace{a+b}^{s_0}}{\underbrace{t+1}_{\text{n (t)}}}') == \
        r'\frac{\overset{s_0}{a+b}}{\underset{\text{n (t)}}{t+1}}'
    st = {}
    assert build_docs.math_to_placeholders('inline $a +\nb$ wraps; $5 and $6 stay', st).endswith('wraps; $5 and $6 stay') and len(st) == 1

@pytest.mark.skipif(CHROMIUM is None, reason='Chromium is not installed (apt-get install chromium); .ci/run installs it')
def test_text_outputs_scroll_and_code_wraps(site, tmp_path):
    "Chromium's computed styles: a text output keeps its lines (scrolls, never breaks a word); code wraps at spaces."
    out, _ = site
    probe = ('<script>var o = document.querySelector(".jp-OutputArea-output pre"), i = document.querySelector(".jp-InputArea-editor pre");'
             'var so = getComputedStyle(o), si = getComputedStyle(i);'
             'document.body.setAttribute("data-probe", [so.whiteSpace, so.wordBreak, so.overflowX, si.whiteSpace, si.wordBreak].join(","));</script>')
    page = out/'probe.html'
    page.write_text((out/'a_page.html').read_text().replace('</body>', probe + '</body>'))
    dom = offline_dom(page, tmp_path)
    assert 'data-probe="pre,normal,auto,pre-wrap,normal"' in dom, re.search(r'data-probe="[^"]*"', dom)
