"""Figures. The landing page's figures and the numbers it quotes come from committed results: drawing them again changes nothing.
Every plotly figure the package draws keeps its axes on its data: on a log axis plotly reads a shape's position in data units and
an annotation's in log10 units, so a label placed in data units (what `add_hline`/`add_vrect`'s `annotation_text` does) turns into
an exponent and stretches the axis to 10^30; here every shape, annotation and set range of every figure stays within a decade of
the data, and in Chromium plotly.js's own axis ranges do. The static explorer's table shows the numbers of the head and constants
its controls pick."""
import ast, json, math, re, shutil, subprocess
from pathlib import Path
import pandas as pd
import plotly, pytest, torch
import plotly.graph_objects as go
from transformers import Qwen2Config, Qwen2ForCausalLM
from conftest import ROOT
import gap_closed, grid_figure
import taylor_calibrate.cache as cache, taylor_calibrate.distill as distill, taylor_calibrate.explore as explore
import taylor_calibrate.policies as policies
import taylor_calibrate.gdn as gdn, taylor_calibrate.regime as regime, taylor_calibrate.stats as stats
import taylor_calibrate.taylor as taylor, taylor_calibrate.teacher as teacher

def test_the_grid_figure_is_drawn_from_the_committed_grid():
    results = grid_figure.load()
    rows = grid_figure.bars(results)
    assert grid_figure.svg(rows, results) == grid_figure.OUT.read_text(), 'run python scripts/grid_figure.py'
    assert [r['key'] for r in rows] == ['naive', 'zero_gate', 'phase1', 'phase2', 'taylor', 'taylor+']
    ratios = [b[k] for r in rows for b in r['teachers'].values() for k in ('lo', 'hi')]
    assert 1 <= min(ratios) and 10 ** (grid_figure.DECADES - 1) < max(ratios) < 10 ** grid_figure.DECADES   # the axis spans the data

def test_the_gap_closed_numbers_and_figure_are_computed_from_the_committed_results():
    res, figure = gap_closed.compute()
    committed = json.loads(gap_closed.OUT_JSON.read_text())
    assert {k: v for k, v in res.items() if k != 'paper_check'} == {k: v for k, v in committed.items() if k != 'paper_check'}, \
        'run python scripts/gap_closed.py'
    assert figure == gap_closed.OUT_SVG.read_text()

def test_gap_closed_is_the_share_of_the_log_gap():
    assert gap_closed.closed(100.0, 100.0, 10.0) == 0 and gap_closed.closed(100.0, 10.0, 10.0) == 1
    assert abs(gap_closed.closed(100.0, 31.622776601683793, 10.0) - 0.5) < 1e-12   # halfway in log space

# ---- every figure function of the package, built on small inputs ----

CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser')

def figure_functions() -> set:
    "'module.name' of every public function or method in taylor_calibrate/ annotated `-> go.Figure` or calling go.Figure / make_subplots."
    found = set()
    def visit(body, module, prefix=''):
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith('_'): visit(node.body, module, f'{prefix}{node.name}.')
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith('_'):
                calls = {ast.unparse(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
                if (node.returns is not None and ast.unparse(node.returns).endswith('Figure')) or calls & {'go.Figure', 'make_subplots'}:
                    found.add(f'{module}.{prefix}{node.name}')
    for path in sorted((ROOT/'taylor_calibrate').glob('*.py')): visit(ast.parse(path.read_text()).body, path.stem)
    return found

@pytest.fixture(scope='module')
def tiny():
    "A tiny random Qwen2 teacher (as in test_explore), random token ids, the explorer's data on them and a short `taylor` calibration."
    from taylor_calibrate.core import calibrate
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256)
    teacher = Qwen2ForCausalLM(cfg).eval()
    ids = torch.randint(0, 96, (640,))
    student = calibrate(teacher, ids, keep=[0], init='taylor', seq_len=64, calib_tokens=128, heldout_tokens=64, steps=3, progress=False)
    data = explore.explorer_data(teacher, None, ids, tokens=256, seq_len=128, heldout_tokens=128)
    return dict(teacher=teacher, ids=ids, student=student, report=student.calibration_report, data=data, stats=data.stats())

def _regime_table():
    "The regime table of the shipped teacher as 05a_regime prints it (uniform:0.25, 1,024 VALID tokens)."
    return pd.DataFrame(dict(layer=[1, 2, 3, 5, 6, 7], context_rms=[0.572, 0.462, 0.691, 0.523, 0.360, 0.403],
                             naive_ratio=[0.251, 0.323, 0.212, 0.259, 0.420, 0.372], naive_cosine=[0.205, 0.126, 0.222, 0.121, 0.112, 0.229],
                             phase1_ratio=[0.007, 0.007, 0.008, 0.006, 0.007, 0.007], phase1_cosine=[0.156, 0.062, 0.172, 0.233, 0.079, -0.147]))

def _recovery_logs():
    from taylor_calibrate.distill import DistillLog
    rec = json.loads((ROOT/'bench'/'results'/'experiments'/'experiments.json').read_text())['recovery']
    return {i: DistillLog.from_json(json.dumps(j)) for i, j in rec['logs'].items()}

def _gauge(name='gauge'):
    from taylor_calibrate.regime import load_gauge_sweep
    return load_gauge_sweep(ROOT/'bench'/'results'/name/'gauge.json')

# the figures each function draws, by label: on the small inputs of the package's tests and on the committed results the docs draw
BUILDERS = {
    'cache.plot_cache_memory': lambda t: {'': cache.plot_cache_memory({'teacher': t['teacher'].config, 'hybrid': t['student'].config},
                                                                      max_len=4096)},
    'core.CalibrationReport.fig_heads': lambda t: {'': t['report'].fig_heads()},
    'core.CalibrationReport.fig_curves': lambda t: {'': t['report'].fig_curves()},
    'core.CalibrationReport.fig_fit': lambda t: {'': t['report'].fig_fit()},
    'distill.recovery_curve': lambda t: {'08 recovery': distill.recovery_curve(_recovery_logs(), targets=(1.05, 1.1, 1.25, 1.5, 2.0))},
    'explore.fig_memory_kernel': lambda t: {'': explore.fig_memory_kernel(explore.kernel_view(t['stats'], 1, 2, t['data'].seq_len,
                                                                                              t['data'].head_dim))},
    'explore.fig_head_attention': lambda t: {'': explore.fig_head_attention(t['data'], 1, 2)},
    'explore.fig_beta_entropy': lambda t: {'': explore.fig_beta_entropy(t['stats'], 1, head=2)},
    'explore.explorer_figure': lambda t: {'': explore.explorer_figure(t['stats'], t['data'].seq_len, t['data'].head_dim)},
    'gdn.plot_online_regression': lambda t: {'': gdn.plot_online_regression()},
    'gdn.plot_retention': lambda t: {'': gdn.plot_retention()},
    'gdn.plot_output_gate': lambda t: {'': gdn.plot_output_gate()},
    'policies.plot_layer_scores': lambda t: {'ar': policies.plot_layer_scores([0], {0: 0.895, 1: 0.584}, 'ar:0.5'),
                                             'ga-s2': policies.plot_layer_scores([1], {0: 310.2, 1: 95.7}, 'ga-s2:0.5')},
    'regime.fig_regime': lambda t: {'05a': regime.fig_regime(_regime_table())},
    'regime.fig_gauge_sweep': lambda t: {'05a': regime.fig_gauge_sweep(_gauge(), 0.502), 'without context': regime.fig_gauge_sweep(_gauge()),
                                         '08 tiny-qwen3': regime.fig_gauge_sweep(_gauge('gauge_tiny-qwen3'), 0.747)},
    'regime.fig_gauge_slider': lambda t: {'05a': regime.fig_gauge_slider(_gauge())},
    'stats.fig_distance_entropy': lambda t: {'': stats.fig_distance_entropy(t['stats'])},
    'stats.fig_distance_mass': lambda t: {'': stats.fig_distance_mass(t['stats'])},
    'stats.fig_head_map': lambda t: {'': stats.fig_head_map(t['stats'])},
    'stats.fig_head_heatmaps': lambda t: {'': stats.fig_head_heatmaps(t['teacher'], t['ids'][:32], [(0, 0), (1, 3)])},
    'taylor.plot_error_vs_logit_scale': lambda t: {'': taylor.plot_error_vs_logit_scale([0.3, 0.01, 0.1], n_heads=2, T=8, d=4)},
    'taylor.plot_error_vs_entropy': lambda t: {'': taylor.plot_error_vs_entropy(*taylor.random_qkv(3, 8, 4, [0.1, 1., 3.]))},
    'teacher.attention_heatmap': lambda t: {'': teacher.attention_heatmap(teacher.attention_maps(t['teacher'], t['ids'][None, :48]),
                                                                          [(0, 1), (1, 2)], n=32)},
    'teacher.training_curve': lambda t: {'': teacher.training_curve(teacher.training_log())},
}
FIGURE_FUNCTIONS = sorted(figure_functions())

def test_every_figure_function_is_built_here():
    assert FIGURE_FUNCTIONS == sorted(BUILDERS), f'add {sorted(set(FIGURE_FUNCTIONS) - set(BUILDERS))} to BUILDERS (and drop ' \
                                                 f'{sorted(set(BUILDERS) - set(FIGURE_FUNCTIONS))})'

def _figures(name, t) -> dict:
    return {f'{name} {label}'.strip(): fig for label, fig in BUILDERS[name](t).items()}

# ---- where plotly puts things ----

CARTESIAN = {'scatter', 'scattergl', 'bar', 'heatmap', 'histogram', 'box', 'violin', 'contour'}

def _axis(ref, letter):
    "Layout key of the axis a position refers to ('x2' -> 'xaxis2'), None for figure-relative positions ('paper', 'x domain')."
    ref = ref or letter
    return None if ref == 'paper' or ref.endswith('domain') else f'{ref[0]}axis{ref[1:]}'

def _numbers(values):
    "The finite numbers among `values`, or None when they are categories (text)."
    out = []
    for v in values:
        if v is None: continue
        if isinstance(v, str): return None
        f = float(v)
        if math.isfinite(f): out.append(f)
    return out

def data_extents(fig) -> dict:
    "Per axis key: (min, max) of the data shown on it, in the axis' own units (log10 on a log axis); None for a category axis."
    vals = {}
    for tr in fig.data:
        if tr.type not in CARTESIAN or tr.visible in (False, 'legendonly'): continue        # what autorange ignores
        for c, other in (('x', 'y'), ('y', 'x')):
            v = tr[c]
            if v is None:                                                  # positions 0..n-1
                if tr.type == 'heatmap' and tr.z is not None: v = range(len(tr.z[0]) if c == 'x' else len(tr.z))
                elif tr[other] is not None: v = range(len(tr[other]))
                else: continue
            key, nums = _axis(tr[f'{c}axis'], c), _numbers(v)
            if nums is None or vals.get(key, []) is None: vals[key] = None; continue
            vals.setdefault(key, []).extend(nums + ([0.0] if tr.type == 'bar' and c == ('x' if tr.orientation == 'h' else 'y') else []))
    out = {}
    for key, nums in vals.items():
        if nums is None: out[key] = None; continue
        if fig.layout[key].type == 'log': nums = [math.log10(n) for n in nums if n > 0]
        if nums: out[key] = (min(nums), max(nums))
    return out

def _slack(key, lo, hi, fig):
    "How far beyond the data an axis may reach: a decade on a log axis, the data's own size on a linear one."
    return 1.0 if fig.layout[key].type == 'log' else max(hi - lo, abs(lo), abs(hi), 1e-9)

def axis_problems(fig) -> list:
    "Every set range, shape and annotation on a data axis that lies beyond that axis' data by more than `_slack`, read as plotly reads it."
    problems, lay = [], fig.layout
    for key, ext in data_extents(fig).items():
        if ext is None: continue
        lo, hi = ext
        log, s = lay[key].type == 'log', _slack(key, lo, hi, fig)
        def check(what, p):
            if not lo - s <= p <= hi + s: problems.append(f'{key}: {what} at {p:.3g} {"(log10)" if log else ""}, data {lo:.3g} to {hi:.3g}')
        if lay[key].range is not None and lay[key].autorange is not True:
            a, b = sorted(lay[key].range)
            check('range start', a); check('range end', b)
            if b < lo or a > hi: problems.append(f'{key}: range {a:.3g} to {b:.3g} misses the data, {lo:.3g} to {hi:.3g}')
        for sh in lay.shapes:
            for c in 'xy':
                if _axis(sh[f'{c}ref'], c) != key: continue
                for p in (sh[f'{c}0'], sh[f'{c}1']):
                    if p is None: continue
                    if log and p <= 0: problems.append(f'{key}: shape at {p} on a log axis'); continue
                    check(f'shape ({sh.type}) {c}', math.log10(p) if log else p)     # shapes: data units, on any axis
        for a in lay.annotations:
            for c in 'xy':
                if _axis(a[f'{c}ref'], c) == key and a[c] is not None:
                    check(f'annotation {a.text!r} {c}', float(a[c]))                 # annotations: log10 units on a log axis
    return problems

def test_a_label_in_data_units_on_a_log_axis_is_caught():
    fig = go.Figure(go.Scatter(x=[0.1, 1, 100], y=[40, 90, 220])).update_layout(xaxis_type='log', yaxis_type='log')
    fig.add_hline(y=37.3, annotation_text='teacher')                   # the annotation lands at y = 37.3, i.e. 10^37.3
    fig.add_vrect(x0=3.5, x1=29.5, annotation_text='range')           # the rectangle itself is in data units: fine
    got = axis_problems(fig)
    assert len(got) == 2 and all("annotation" in p for p in got) and {p[:5] for p in got} == {'yaxis', 'xaxis'}, got
    fixed = go.Figure(go.Scatter(x=[0.1, 1, 100], y=[40, 90, 220])).update_layout(xaxis_type='log', yaxis_type='log')
    fixed.add_hline(y=37.3).add_annotation(x=1, xref='paper', y=math.log10(37.3), text='teacher', showarrow=False)
    fixed.add_vrect(x0=3.5, x1=29.5).add_annotation(x=math.log10(10), y=1, yref='paper', text='range', showarrow=False)
    assert axis_problems(fixed) == []
    floor = go.Figure(go.Scatter(x=[1, 2], y=[1e-4, 1])).update_layout(yaxis=dict(type='log', range=[-3, 0.05]))   # a range that cuts a tail
    assert axis_problems(floor) == []
    assert axis_problems(floor.update_layout(yaxis_range=[-3, 24])) == ['yaxis: range end at 24 (log10), data -4 to 0']

@pytest.mark.parametrize('name', sorted(BUILDERS))
def test_shapes_annotations_and_ranges_stay_on_the_data(name, tiny):
    for label, fig in _figures(name, tiny).items():
        assert isinstance(fig, go.Figure), label
        assert axis_problems(fig) == [], label
        for tr in fig.data:                                            # cell text, where drawn, at a readable size
            if tr.type == 'heatmap' and (tr.texttemplate or tr.text is not None): assert (tr.textfont.size or 0) >= 10, label

# ---- what plotly.js makes of them ----

_PAGE = '''<html><head><meta charset="utf-8"><script src="plotly.min.js"></script></head><body><pre id="result">pending</pre>
<script>
(async function() {
  var figs = FIGS, out = {};
  for (var name in figs) {
    var gd = document.createElement('div'); gd.style.width = '700px'; gd.style.height = '500px'; document.body.appendChild(gd);
    try {
      await Plotly.newPlot(gd, figs[name].data, figs[name].layout);
      out[name] = {};
      for (var k in gd._fullLayout) if (/^[xy]axis\\d*$/.test(k)) out[name][k] = {type: gd._fullLayout[k].type, range: gd._fullLayout[k].range};
    } catch (e) { out[name] = {error: String(e)}; }
  }
  document.getElementById('result').textContent = JSON.stringify(out);
})();
</script></body></html>'''

def _in_chromium(html: str, tmp_path) -> dict:
    shutil.copy(Path(plotly.__file__).parent/'package_data'/'plotly.min.js', tmp_path/'plotly.min.js')
    page = tmp_path/'page.html'
    page.write_text(html, encoding='utf-8')
    dom = subprocess.run([CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--virtual-time-budget=30000',
                          f'--user-data-dir={tmp_path/"profile"}', '--dump-dom', page.as_uri()], capture_output=True, text=True, timeout=300).stdout
    return json.loads(re.search(r'<pre id="result">(.*?)</pre>', dom, re.S).group(1).replace('&amp;', '&').replace('&lt;', '<').replace('&gt;', '>'))

@pytest.mark.skipif(CHROMIUM is None, reason='Chromium is not installed')
def test_plotly_js_draws_every_axis_over_its_data(tiny, tmp_path):
    figs = {label: fig for n in sorted(BUILDERS) for label, fig in _figures(n, tiny).items()}
    got = _in_chromium(_PAGE.replace('FIGS', '{' + ','.join(f'{json.dumps(k)}: {f.to_json()}' for k, f in figs.items()) + '}'), tmp_path)
    bad = []
    for name, fig in figs.items():
        assert 'error' not in got[name], (name, got[name])
        for key, ext in data_extents(fig).items():
            if ext is None or key not in got[name]: continue
            full, (lo, hi) = got[name][key], ext
            assert full['type'] == (fig.layout[key].type or full['type']), (name, key)
            a, b = sorted(full['range'])
            s = _slack(key, lo, hi, fig)
            pad = 0.1 * max(hi - lo, 1e-9) + (0.1 if full['type'] == 'log' else 0)      # autorange's own padding
            if a < lo - s - pad or b > hi + s + pad: bad.append(f'{name} {key}: drawn {a:.3g} to {b:.3g}, data {lo:.3g} to {hi:.3g}')
            explicit = fig.layout[key].range is not None and fig.layout[key].autorange is not True
            if explicit and (b < lo or a > hi): bad.append(f'{name} {key}: drawn {a:.3g} to {b:.3g} misses the data {lo:.3g} to {hi:.3g}')
            if not explicit and (a > lo + 1e-9 * max(1, abs(lo)) or b < hi - 1e-9 * max(1, abs(hi))):
                bad.append(f'{name} {key}: drawn {a:.3g} to {b:.3g} cuts the data {lo:.3g} to {hi:.3g}')
    assert not bad, '\n'.join(bad)

# ---- the static explorer's numbers table follows its controls ----

_DRIVE = '''<html><head><meta charset="utf-8"><script src="plotly.min.js"></script></head><body>
<div id="fig" style="width:700px;height:980px"></div><pre id="result">pending</pre>
<script>
(async function() {
  var gd = document.getElementById('fig'), f = FIG, out = {};
  var table = () => { var shown = gd.data.map((t, i) => [t, i]).filter(([t, i]) => t.type === 'table' && t.visible !== false);
                      return {shown: shown.map(([t, i]) => i), cells: shown.length ? JSON.parse(JSON.stringify(shown[0][0].cells.values)) : null,
                              drawn: Array.from(gd.querySelectorAll('.cell-text')).map(e => e.textContent)}; };
  try {
    await Plotly.newPlot(gd, f.data, f.layout);
    out.start = table();
    var pick = gd._fullLayout.updatemenus[0].buttons[PICK].args;        // what choosing a head in the menu runs
    await Plotly.update(gd, pick[0], pick[1]);
    out.picked = table();
    var m = gd._fullLayout.sliders[0].steps[0].args;                     // the half-life slider's first step
    await Plotly.update(gd, m[0], m[1], m[2]);
    out.m = table();
    var b = gd._fullLayout.sliders[1].steps[0].args;                     // the beta slider's first step
    await Plotly.restyle(gd, b[0], b[1]);
    out.beta = table();
    out.title = gd.layout.title.text;
  } catch (e) { out.error = String(e); }
  document.getElementById('result').textContent = JSON.stringify(out);
})();
</script></body></html>'''

@pytest.mark.skipif(CHROMIUM is None, reason='Chromium is not installed')
def test_the_static_explorer_shows_the_numbers_of_the_chosen_head_and_constants(tiny, tmp_path):
    st, d = tiny['stats'], tiny['data']
    fig = explore.explorer_figure(st, d.seq_len, d.head_dim)
    heads = [b.label for b in fig.layout.updatemenus[0].buttons]
    out = _in_chromium(_DRIVE.replace('FIG', fig.to_json()).replace('PICK', str(heads.index('layer 1, head 2'))), tmp_path)
    assert 'error' not in out, out
    m0, (lo0, span0) = explore.DOCS_MULTIPLIERS[0], explore.DOCS_BETAS[0]
    for stage, head, m, lo, span in (('start', (0, 0), 1.0, 0.3, 0.4), ('picked', (1, 2), 1.0, 0.3, 0.4), ('m', (1, 2), m0, 0.3, 0.4),
                                     ('beta', (1, 2), m0, lo0, span0)):
        v = explore.kernel_view(st, *head, d.seq_len, d.head_dim, multiplier=m, beta_lo=lo, beta_span=span)
        got = out[stage]
        assert len(got['shown']) == 1, (stage, got['shown'])                                     # one table at a time
        teacher_col, gdn_col = got['cells'][1], got['cells'][3]
        want = [(teacher_col[0], f"{v['mean_distance']:.2f}"), (teacher_col[1], f"{v['entropy']:.3f}"),
                (teacher_col[3], f"{v['concentration']:.3f}"), (gdn_col[0], f"{v['half_life']:.2f}"), (gdn_col[1], f"{v['dt_bias']:.3f}"),
                (gdn_col[2], f"{v['beta_star']:.3f} = {lo:.2f} + {span:.2f}"), (gdn_col[3], f"{v['implied_distance']:.2f}")]
        assert all(cell.startswith(w) for cell, w in want), (stage, want)
        assert all(any(t.startswith(w) for t in got['drawn']) for _, w in want), (stage, got['drawn'])   # and on the page
    assert out['title'].startswith('layer 1, head 2') and f'{m0:.2f} × d_h' in out['title']
