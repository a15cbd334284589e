"The fallback docs build: executed notebooks as static HTML whose plotly figures draw offline."
import re
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
    assert html.count('<math') == 2 and 'display="block"' in html and '$not maths$' in html, 'maths is MathML, code spans are left alone'
    assert 'href="b_page.html"' in html and 'href="a_page.html"' in (out/'b_page.html').read_text()

@pytest.mark.skipif(CHROMIUM is None, reason='Chromium is not installed (apt-get install chromium); .ci/run installs it')
def test_figures_draw_offline_in_chromium(site, tmp_path):
    out, _ = site
    dom = offline_dom(out/'a_page.html', tmp_path)
    assert dom.count('class="main-svg"') >= 2, 'plotly did not draw both figures offline'

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
        assert 'TCMATH' not in html and 'mathjax' not in html.lower(), f'{page.name}: maths not rendered to MathML'
        for target, anchor in internal_links(html):
            dest = real_site/target if target else page
            assert dest.exists(), f'{page.name} links to missing {target}'
            if anchor and dest.suffix == '.html':
                assert f'id="{anchor}"' in dest.read_text(), f'{page.name} links to missing anchor {target}#{anchor}'

@pytest.mark.skipif(CHROMIUM is None, reason='Chromium is not installed (apt-get install chromium); .ci/run installs it')
def test_site_draws_offline(real_site, tmp_path):
    for page in sorted(real_site.glob('*.html')):
        html, dom = page.read_text(), offline_dom(page, tmp_path)
        assert 'tc-nav' in dom, f'{page.name} did not load'
        n = html.count('class="plotly-graph-div"')
        assert dom.count('class="plot-container plotly"') == n, f'{page.name}: not all of its {n} plotly figures drew offline'
        assert dom.count('<math') == html.count('<math'), f'{page.name}: maths lost in the browser'
