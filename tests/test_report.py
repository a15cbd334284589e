"""The calibration report and its HTML page say what was run, and read back from strict JSON.

A report from `calibrate` on a tiny random teacher records the teacher, the data, the seed, the versions and the date;
`report_html` puts them, the command line, each init's budgets and one sentence per init (from its recipe) at the top of
the page; every table scrolls sideways inside its own container and has a legend of its columns; in the Phase-2 chart a
layer's training line and held-out markers share one colour. `to_json` writes strict JSON (NaN as null), `from_json`
reads null back as NaN and loads a report saved without the fields that record the run. Every name `taylor_calibrate.core`
exports is read from it, the memory plumbing's (defined in `taylor_calibrate.windows`) included.
"""
import html, json, math, re, shlex, sys
import pytest, torch, transformers
import taylor_calibrate
import taylor_calibrate.core as core
import taylor_calibrate.windows as windows
from taylor_calibrate.core import CalibrationReport, calibrate, get_recipe, report_html, REPORT_COLUMNS
from taylor_calibrate.convert import random_teacher

torch.set_num_threads(1)

STRICT = dict(parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))   # json.loads that refuses NaN and Infinity
# the names `taylor_calibrate.core` exports, the memory plumbing's included
CORE_NAMES = ['EVAL_SPLIT', 'RECIPES', 'BATCH_BYTES', 'CAPTURE_BUDGET', 'CAPTURE_FLOOR', 'token_windows', 'Recipe', 'get_recipe',
              'realised_half_life', 'realised_beta', 'set_decay', 'concentration', 'set_write_gate', 'windows_at_once',
              'valid_by_windows', 'ols_by_windows', 'mean_by_windows', 'gated_head_outputs', 'set_value_scale',
              'set_output_gate', 'value_output_norms', 'balanced_gauge', 'rescale_value_output', 'phase1', 'layer_fit',
              'mse_backward', 'phase2', 'CalibrationReport', 'calibrate', 'capture_bytes', 'capture_groups',
              'report_summary', 'report_html']


@pytest.fixture(scope='module')
def reports():
    "Three reports of one tiny teacher: a naive copy, taylor, and taylor+ on layers without an output gate (alpha* is NaN)."
    teacher = random_teacher('qwen2', layers=4)
    ids = torch.randint(0, teacher.config.vocab_size, (12, 32), generator=torch.Generator().manual_seed(1))
    run = lambda init, **kw: calibrate(teacher, ids, keep=[0, 2], init=init, seq_len=32, calib_tokens=256, heldout_tokens=64,
                                       steps=3, seed=7, progress=False, **kw).calibration_report
    return [run('naive'), run('taylor'), run('taylor+', gdn_options=dict(use_gate=False))]


@pytest.fixture(scope='module')
def page(reports):
    return report_html(reports, {'teacher': 10.0, 'naive': 40.0, 'taylor': 20.0, 'taylor+': 15.5}, evaluation='4,096 test tokens',
                       command='taylor-calibrate demo --out run --seed 7')


def test_the_report_records_what_was_run(reports):
    r = reports[1]
    assert r.seed == 7 and r.data['source'] == 'token ids, shape [12, 32]'
    assert r.teacher['model_type'] == 'qwen2' and r.teacher['layers'] == 4 and r.teacher['dtype'] == 'float32'
    assert r.versions == {'taylor-calibrate': taylor_calibrate.__version__, 'torch': torch.__version__,
                          'transformers': transformers.__version__, 'python': r.versions['python']}
    assert re.fullmatch(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00', r.created)
    assert core.describe_data('train') == "the shipped corpus, split 'train'" and core.describe_data(['a', 'b']) == 'a list of 2 texts'


def test_the_page_header(reports, page):
    text = html.unescape(re.sub(r'<[^>]+>', ' ', page))
    head = text[text.index('What was run'):text.index('Test perplexity')]
    for words in ('qwen2, 4 layers', 'token ids, shape [12, 32]', 'kept as attention: 0, 2', 'converted to Gated DeltaNet: 1, 3',
                  f'taylor-calibrate {taylor_calibrate.__version__}', f'torch {torch.__version__}', f'transformers {transformers.__version__}',
                  '4,096 test tokens', 'taylor-calibrate demo --out run --seed 7', reports[0].created[:10]):
        assert words in head, words
    assert re.search(r'\bseed\s+7\b', head)
    # each init's budgets from its recipe, and one sentence per init from its switches
    run = re.search(r'<h2>What was run</h2>.*?(<table.*?</table>)', page, re.S).group(1)
    rows = [re.findall(r'<td>(.*?)</td>', tr) for tr in re.findall(r'<tr>(.*?)</tr>', run, re.S)]
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in rows] == [('naive', '256', '64', '8 + 2 of 32', 'none'),
                                                              ('taylor', '256', '64', '8 + 2 of 32', '3'),
                                                              ('taylor+', '256', '64', '8 + 2 of 32', '3')]
    for r in reports: assert get_recipe(r.recipe).describe() in html.unescape(page), r.init
    assert len({get_recipe(r.recipe).describe() for r in reports}) == 3


def test_the_command_defaults_to_this_process(reports):
    assert html.escape(shlex.join(sys.argv)) in report_html(reports[:1])


def test_every_table_scrolls_and_has_a_legend(reports, page):
    tables = re.findall(r'<table', page)
    assert len(tables) == 2 + len(reports) and page.count('<div class="scroll"><table') == len(tables)
    assert re.search(r'\.scroll\{overflow-x:auto', page)
    for table, legend in re.findall(r'(<table.*?</table>)</div>\s*<dl class="legend">(.*?)</dl>', page, re.S):
        columns = [html.unescape(c) for c in re.findall(r'<th>(.*?)</th>', table)]
        named = [html.unescape(c) for c in re.findall(r'<dt>(.*?)</dt>', legend)]
        assert columns == named, (columns, named)
    assert len(re.findall(r'</table></div>\s*<dl class="legend">', page)) == len(tables)
    # the layer tables' columns in words, with 00_taylor's symbols where it has one
    for c in ('mse_copy', 'cos_phase1', 'ratio_phase2', 'alpha', 'gauge_k', 'layer'): assert c in REPORT_COLUMNS
    assert '<dt>alpha</dt> <dd>&alpha;*: ' in page and '<dt>layer</dt> <dd>&ell;: ' in page


def plotly_figures(page):
    "Each plotly figure of a page: (traces, layout), parsed from its `Plotly.newPlot(id, data, layout, config)` call."
    dec, out = json.JSONDecoder(), []
    for m in re.finditer(r'Plotly\.newPlot\(\s*"[^"]+",\s*', page):
        data, end = dec.raw_decode(page, m.end())
        layout, _ = dec.raw_decode(page, page.index('{', end))
        out.append((data, layout))
    return out


def test_one_colour_per_layer_in_the_phase_2_chart(reports, page):
    figs = [(d, l) for d, l in plotly_figures(page) if 'Phase-2' in l['title']['text']]
    assert len(figs) == 2                                        # taylor and taylor+; the naive copy has no Phase 2
    for data, layout in figs:
        colour = {}
        for t in data:
            if t['legendgroup'] == 'key': continue                     # the legend's key: a gray line and a gray marker
            c = t['line']['color'] if t['mode'] == 'lines' else t['marker']['color']
            colour.setdefault(t['legendgroup'], set()).add(c)
        assert set(colour) == {'layer 1', 'layer 3'} and all(len(c) == 1 for c in colour.values()), colour
        assert len({next(iter(c)) for c in colour.values()}) == 2   # and the layers differ
        assert [t['name'] for t in data if t.get('showlegend', True)] == ['layer 1', 'layer 3', 'training loss', 'held-out loss']
        assert layout['yaxis']['type'] == 'log'


def test_round_ticks_on_log_axes():
    "1, 2 and 5 per decade spanning the data (a decade apart past four decades); plotly's own ticks where fewer than two fall inside."
    assert core._log_ticks([0.03, 0.6]) == [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
    assert core._log_ticks([3, float('nan')], [40]) == [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
    assert core._log_ticks([0.5, 5000, 0, -1]) == [0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0]
    assert core._log_ticks([1.2, 1.8]) is None and core._log_ticks([]) is None


def test_fig_heads_has_its_own_beta_axis_and_the_legend_below(reports):
    layout = reports[1].fig_heads().layout
    assert layout.yaxis2.tickmode == 'linear' and list(layout.yaxis2.range) == [0, 1] and layout.yaxis2.overlaying == 'y'
    assert layout.legend.orientation == 'h' and layout.legend.y < 0 and layout.margin.b >= 100
    assert 't<sub>1/2</sub>' in layout.yaxis.title.text and 'β' in layout.yaxis2.title.text
    names = [t.name for t in reports[1].fig_heads().data]
    assert 'realised mean β' in names and 'target β*' in names


def test_strict_json_round_trip(reports):
    r = reports[2]
    assert all(math.isnan(l['alpha']) for l in r.layers)          # layers without an output gate
    text = r.to_json()
    d = json.loads(text, **STRICT)
    assert all(l['alpha'] is None for l in d['layers']) and all(h['alpha'] is None for h in d['heads'])
    back = CalibrationReport.from_json(text)
    assert all(math.isnan(l['alpha']) for l in back.layers) and all(math.isnan(h['alpha']) for h in back.heads)
    assert back.to_json() == text and back.seed == 7 and back.teacher == r.teacher
    for rep in reports: json.loads(rep.to_json(), **STRICT)
    naive = CalibrationReport.from_json(reports[0].to_json())         # no Phase 1: NaN targets in every head row
    assert all(math.isnan(h['beta_star']) for h in naive.heads)


def test_a_report_saved_without_the_run_fields_loads(reports):
    "A calibration_report.json or reports.json as older versions of the package write it: bare NaN, no seed, teacher, versions or date."
    old = {k: v for k, v in json.loads(reports[2].to_json()).items() if k not in ('seed', 'teacher', 'versions', 'created')}
    old['data'] = {k: v for k, v in old['data'].items() if k != 'source'}
    for l in old['layers']: l['alpha'] = math.nan
    text = json.dumps(old)
    assert 'NaN' in text
    r = CalibrationReport.from_json(text)
    assert (r.seed, r.teacher, r.versions, r.created) == (None, {}, {}, None) and all(math.isnan(l['alpha']) for l in r.layers)
    page = html.unescape(report_html([r]))
    assert 'not recorded' in page and 'the reports do not record theirs' in page
    json.loads(r.to_json(), **STRICT)


def test_print_and_repr(reports):
    r = reports[1]
    assert repr(r) == "CalibrationReport(init='taylor', converted=[1, 3], keep=[0, 2], tokens=256+64, seed=7)"
    text = str(r)
    assert text == r.summary() and text.startswith('init taylor: Copies W_Q')
    assert 'mse_phase1' in text and "alpha (α*): Phase 1's output-gate scale" in text
    assert '<table' in r._repr_html_()                          # a notebook shows the table


def test_core_keeps_its_names():
    "Every name `core` exports is read from it; the memory plumbing's names are the objects of `windows`."
    ns = {}
    exec('from taylor_calibrate.core import *', ns)
    assert set(CORE_NAMES) <= set(core.__all__) and set(CORE_NAMES) <= set(ns), sorted(set(CORE_NAMES) - set(ns))
    for name in ('windows_at_once', 'valid_by_windows', 'ols_by_windows', 'mean_by_windows', 'mse_backward', 'capture_bytes', 'capture_groups'):
        assert getattr(core, name) is getattr(windows, name), name
    from taylor_calibrate.core import BATCH_BYTES, CAPTURE_BUDGET, CAPTURE_FLOOR, windows_at_once  # noqa: F401
    assert (BATCH_BYTES, CAPTURE_BUDGET, CAPTURE_FLOOR) == (windows.BATCH_BYTES, windows.CAPTURE_BUDGET, windows.CAPTURE_FLOOR)
    with pytest.raises(AttributeError): core.NO_SUCH_NAME
    import ast, inspect
    assert not any(isinstance(n, ast.ImportFrom) and (n.module or '').endswith('core') for n in ast.walk(ast.parse(inspect.getsource(windows)))), \
        'windows must not import core'
