"""The explorer used as a reader uses it: JupyterLab serving a copy of `nbs/` with `07_explore.ipynb` open, headless Chromium driven by Playwright,
the `explore()` cell run from the notebook's Run menu and keyboard, its sliders moved with the arrow keys, and every
check read from the rendered page (the numbers readout, the slider readouts, the SVG plotly drew), never from the kernel."""
import json, os, re, shutil, signal, socket, subprocess, sys, time, urllib.request
from urllib.parse import urlparse
import pytest
from conftest import ROOT

CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser')
SCREENSHOT = ROOT/'bench'/'results'/'screenshots'/'explorer_jupyterlab.png'
NOTEBOOK = '07_explore.ipynb'
LOCAL = ('127.0.0.1', 'localhost', '[::1]', '::1')

def _need(module, what):
    try: __import__(module)
    except ImportError: pytest.skip(f'{what} is not installed', allow_module_level=True)

if CHROMIUM is None: pytest.skip('Chromium is not installed (apt-get install chromium)', allow_module_level=True)
_need('playwright.sync_api', 'playwright (pip install playwright)')
_need('jupyterlab', 'jupyterlab')
from playwright.sync_api import sync_playwright, TimeoutError as PlaywrightTimeout

# Lab settings for a quiet, read-only session: no autosave (the served copy stays as it was), no news or update toasts.
_SETTINGS = {'@jupyterlab/docmanager-extension/plugin': {'autosave': False},
             '@jupyterlab/apputils-extension/notification': {'fetchNews': 'false', 'checkForUpdates': False}}

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]

def _answers(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # loopback, whatever the proxy settings
    try:
        with opener.open(url, timeout=5) as r: return r.status == 200
    except OSError: return False

@pytest.fixture(scope='module')
def lab(tmp_path_factory):
    "A JupyterLab server on a free loopback port, serving a temporary copy of `nbs/` (the working directory too); stopped, kernels and all, at the end."
    tmp = tmp_path_factory.mktemp('jupyterlab')
    root = tmp/'nbs'
    shutil.copytree(ROOT/'nbs', root)
    for name, values in _SETTINGS.items():
        f = tmp/'settings'/f'{name}.jupyterlab-settings'
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    port, token = _free_port(), os.urandom(16).hex()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp/'runtime'), JUPYTER_CONFIG_DIR=str(tmp/'config'), PYTHONUNBUFFERED='1')
    cmd = [sys.executable, '-m', 'jupyterlab', '--no-browser', '--ServerApp.ip=127.0.0.1', f'--ServerApp.port={port}',
           '--ServerApp.port_retries=0', f'--IdentityProvider.token={token}', f'--ServerApp.root_dir={root}',
           f'--LabApp.user_settings_dir={tmp/"settings"}', f'--LabApp.workspaces_dir={tmp/"workspaces"}',
           '--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate', '--NotebookNotary.db_file=:memory:',
           '--LabApp.extension_manager=readonly', '--ServerApp.terminals_enabled=False', '--allow-root']
    log = open(tmp/'server.log', 'w')
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f'http://127.0.0.1:{port}'
    try:
        deadline = time.monotonic() + 120
        while not _answers(f'{base}/api/status?token={token}'):
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(f'JupyterLab did not come up on {base}:\n' + (tmp/'server.log').read_text()[-3000:])
            time.sleep(0.5)
        yield dict(base=base, token=token, root=root, log=tmp/'server.log')
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)                       # the server shuts its kernels down on the way out
            try: proc.wait(30)
            except subprocess.TimeoutExpired: pass
        try: os.killpg(proc.pid, signal.SIGKILL)                  # whatever of its process group is still there
        except (ProcessLookupError, PermissionError): pass
        proc.wait(10)
        log.close()

@pytest.fixture(scope='module')
def browser():
    "System Chromium, headless, with no way out but loopback (a dead proxy for everything else)."
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=['--proxy-server=http://127.0.0.1:9', '--proxy-bypass-list=127.0.0.1;localhost;[::1]',
                                    '--disable-background-networking', '--disable-component-update'])
        try: yield b
        finally: b.close()

@pytest.fixture
def page(browser):
    "A 1280x900 page whose requests to any host but loopback are aborted (and listed in `page.blocked`)."
    ctx = browser.new_context(viewport=dict(width=1280, height=900))
    blocked = []
    def guard(route):
        if urlparse(route.request.url).hostname in LOCAL or route.request.url.startswith(('data:', 'blob:')): route.continue_()
        else: blocked.append(route.request.url); route.abort()
    ctx.route('**/*', guard)
    pg = ctx.new_page()
    pg.blocked, pg.errors = blocked, []
    pg.on('pageerror', lambda e: pg.errors.append(str(e)))
    try: yield pg
    finally: ctx.close()

# Everything the checks read, from the explorer's rendered output: the numbers table, the slider readouts and, per plotly
# figure (keyed by the kind of its title), the title and the drawn SVG (line paths, marker positions).
_STATE = r'''cell => {
  const nums = {}, sliders = {}, figs = {};
  for (const tr of cell.querySelectorAll('.widget-html tr')) {
    const td = tr.querySelectorAll('td');
    if (td.length === 2) nums[td[0].textContent.trim()] = td[1].textContent.trim();
  }
  const head = cell.querySelector('.widget-html b');
  for (const s of cell.querySelectorAll('.widget-slider')) {
    const l = s.querySelector('.widget-label'), r = s.querySelector('.widget-readout');
    if (l && r) sliders[l.textContent.trim()] = r.textContent.trim();
  }
  for (const gd of cell.querySelectorAll('.js-plotly-plot')) {
    const t = gd.querySelector('.gtitle'), title = t ? t.textContent : '';
    const kind = title.includes('against entropy') ? 'beta' : title.includes('half-life') ? 'kernel'
               : title.includes('attention on the first') ? 'map' : title;
    figs[kind] = {title: title,
                  lines: Array.from(gd.querySelectorAll('.scatterlayer path.js-line'), p => p.getAttribute('d')),
                  points: Array.from(gd.querySelectorAll('.scatterlayer path.point'), p => p.getAttribute('transform'))};
  }
  return {head: head ? head.textContent.trim() : null, nums: nums, sliders: sliders, figs: figs};
}'''

MULT, BETA_LO, BETA_SPAN = 'half-life × d_h', 'β lo', 'β span'
BETA, DT, HALF, CONC = 'write strength β*', 'decay bias dt_bias (A_log = 0)', 'half-life', 'concentration κ_h'
num = lambda s: float(re.match(r'\s*(-?[\d.]+)', s).group(1))

def _explore_cell(page):
    "The notebook's code cell whose source is `#| notest` / `explore()` (waiting until the notebook has rendered it)."
    find = '''() => Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell')).findIndex(c =>
                 Array.from(c.querySelectorAll('.jp-InputArea .cm-line'), l => l.textContent.trim()).filter(Boolean).join('\\n')
                 === '#| notest\\nexplore()')'''
    page.wait_for_function(f'({find})() >= 0', timeout=60_000)
    return page.locator('.jp-Notebook .jp-CodeCell').nth(page.evaluate(find))

def _select(cell):
    "Select a cell as a person does: click its prompt (command mode)."
    cell.scroll_into_view_if_needed()
    cell.locator('.jp-InputPrompt').click()

def _run_menu(page, item):
    page.locator('.lm-MenuBar-itemLabel', has_text=re.compile(r'^Run$')).click()
    page.locator('.lm-Menu-itemLabel', has_text=re.compile(f'^{re.escape(item)}$')).click()

def _wait_for(page, cell, cond, what, timeout=60_000):
    "Wait until `cond(state)` (a JS expression over the explorer's DOM state `s`) holds; return that state."
    try: page.wait_for_function(f'cell => {{ const s = ({_STATE})(cell); return ({cond}) ? s : false; }}',
                                arg=cell.element_handle(), timeout=timeout, polling=200)
    except PlaywrightTimeout: pytest.fail(f'{what}: the page never showed {cond}; it shows {json.dumps(cell.evaluate(_STATE), ensure_ascii=False)[:3000]}')
    return cell.evaluate(_STATE)

def _press(cell, label, key, times):
    "Focus a slider's handle (found by its description) and press `key` `times` times."
    handle = cell.locator('.widget-slider', has=cell.page.locator('.widget-label', has_text=label)).locator('.noUi-handle')
    handle.focus()
    for _ in range(times): handle.press(key)

def test_explorer_in_jupyterlab(lab, page):
    t0 = time.monotonic()
    page.goto(f"{lab['base']}/lab/tree/{NOTEBOOK}?token={lab['token']}", wait_until='domcontentloaded', timeout=90_000)
    page.locator('.jp-Notebook').first.wait_for(timeout=90_000)
    # The notebook names no kernel: JupyterLab asks, and the reader accepts the default (Python 3).
    dialog = page.locator('.jp-Dialog')
    try: dialog.wait_for(timeout=30_000)
    except PlaywrightTimeout: pass                                      # a notebook that names its kernel starts it unasked
    else: dialog.locator('.jp-Dialog-button.jp-mod-accept').click()
    page.locator('.jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current').click()   # fold the file browser away: room for the figures
    page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for(timeout=90_000)
    cell = _explore_cell(page)

    # Run everything above the explorer cell (its definitions, imports and checks), then the cell itself with Shift+Enter.
    _select(cell)
    _run_menu(page, 'Run All Above Selected Cell')
    _select(cell)
    page.keyboard.press('Shift+Enter')
    page.wait_for_function('''cell => cell.querySelector('.widget-slider .noUi-handle') && cell.querySelectorAll('.js-plotly-plot .gtitle').length >= 3
                              || Array.from(document.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
                                      .some(o => o.textContent.includes('Traceback'))''', arg=cell.element_handle(), timeout=150_000, polling=500)
    errors = [o for o in page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]').all_inner_texts() if 'Traceback' in o]
    assert not errors, 'a notebook cell failed:\n' + errors[0][-2000:]
    t_run = time.monotonic() - t0

    s0 = cell.evaluate(_STATE)
    assert set(s0['figs']) == {'map', 'kernel', 'beta'}, s0['figs'].keys()
    # explore() on the shipped teacher opens on the head every notebook follows, teacher.EXAMPLE_HEAD = (5, 1)
    assert s0['head'] == 'layer 5, head 1' and s0['figs']['kernel']['lines'] and s0['figs']['beta']['points']

    # Another head from the dropdown: the readout and all three figures follow it.
    cell.locator('.widget-dropdown', has=page.locator('.widget-label', has_text=re.compile(r'^head$'))).locator('select').select_option(label='head 2')
    s1 = _wait_for(page, cell, "s.head === 'layer 5, head 2' && s.figs.kernel && s.figs.kernel.title.startsWith('layer 5, head 2')"
                               " && s.figs.map && s.figs.map.title.startsWith('layer 5, head 2') && s.figs.beta", 'head 2')
    assert s1['figs']['kernel']['lines'] != s0['figs']['kernel']['lines']

    # The half-life slider, ten steps of 0.01 to the right: dt_bias falls, the half-life grows by the same factor, the kernel is redrawn.
    m0 = float(s1['sliders'][MULT]); m1 = f'{m0 + 0.10:.2f}'
    _press(cell, MULT, 'ArrowRight', 10)
    s2 = _wait_for(page, cell, f"s.sliders[{json.dumps(MULT)}] === '{m1}' && (s.nums[{json.dumps(HALF)}] || '').includes('({m1} × d_h)')"
                               f" && s.figs.kernel && s.figs.kernel.title.includes('({m1} × d_h)') && s.figs.beta", 'half-life slider')
    assert s2['nums'][DT] != s1['nums'][DT] and num(s2['nums'][DT]) < num(s1['nums'][DT]), (s1['nums'][DT], s2['nums'][DT])
    if num(s1['nums'][HALF]) > 0.5:                                         # above the half-token floor the half-life scales with m
        assert num(s2['nums'][HALF]) / num(s1['nums'][HALF]) == pytest.approx(float(m1) / m0, rel=0.01)
    assert s2['nums'][BETA] == s1['nums'][BETA]                             # ... and beta* does not move
    assert s2['figs']['kernel']['lines'] != s1['figs']['kernel']['lines'], 'the kernel figure was not redrawn'

    # beta_lo, five steps right: beta* = lo + span c rises by 0.05, the beta-vs-entropy markers and the readable curve move.
    lo0, span0 = float(s2['sliders'][BETA_LO]), float(s2['sliders'][BETA_SPAN])
    lo1 = f'{lo0 + 0.05:.2f}'
    _press(cell, BETA_LO, 'ArrowRight', 5)
    s3 = _wait_for(page, cell, f"s.sliders[{json.dumps(BETA_LO)}] === '{lo1}' && s.figs.beta"
                               f" && s.figs.beta.title.includes('β* = {lo1} + {span0:.2f} κ') && s.figs.kernel", 'beta lo slider')
    c = num(s3['nums'][CONC])
    assert s3['nums'][BETA] != s2['nums'][BETA]
    assert num(s3['nums'][BETA]) == pytest.approx(float(lo1) + span0 * c, abs=2e-3)
    assert s3['nums'][DT] == s2['nums'][DT]
    assert s3['figs']['beta']['points'] != s2['figs']['beta']['points'], 'the beta-vs-entropy markers did not move'
    assert s3['figs']['kernel']['lines'] != s2['figs']['kernel']['lines'], 'the readable-fraction curve was not redrawn'

    # beta_span, four steps left: beta* falls by 0.04 c.
    span1 = f'{span0 - 0.04:.2f}'
    _press(cell, BETA_SPAN, 'ArrowLeft', 4)
    s4 = _wait_for(page, cell, f"s.sliders[{json.dumps(BETA_SPAN)}] === '{span1}' && s.figs.beta"
                               f" && s.figs.beta.title.includes('β* = {lo1} + {span1} κ') && s.figs.kernel", 'beta span slider')
    assert num(s4['nums'][BETA]) == pytest.approx(float(lo1) + float(span1) * c, abs=2e-3)
    if 0.04 * c > 2e-3: assert s4['nums'][BETA] != s3['nums'][BETA]
    assert s4['figs']['beta']['points'] != s3['figs']['beta']['points']

    # The picture: the explorer's output zoomed out so that its controls, readout and three figures fit one 1280x900 screen.
    page.evaluate('''cell => { const out = cell.querySelector('.jp-Cell-outputWrapper');
                               out.style.zoom = '0.6'; out.querySelector('.widget-vbox').scrollIntoView({block: 'start'}); }''',
                  cell.element_handle())
    page.wait_for_timeout(500)                                         # one more frame for the zoomed layout
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT))
    print(f'explorer drawn {t_run:.0f} s after opening the page, whole drive {time.monotonic() - t0:.0f} s; '
          f'blocked requests: {page.blocked or "none"}; page errors: {page.errors or "none"}')
