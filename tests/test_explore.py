"The explorer on a tiny random teacher fed token ids (not the shipped one), and its static twin driven in headless Chromium."
import json, math, re, shutil, subprocess
from pathlib import Path
import plotly, pytest, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from taylor_calibrate.explore import explore, explorer_figure, kernel_view, DOCS_MULTIPLIERS, DOCS_BETAS

CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser')

@pytest.fixture(scope='module')
def ex():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256)
    teacher = Qwen2ForCausalLM(cfg).eval()
    return explore(teacher, split=torch.randint(0, 96, (640,)), tokens=256, seq_len=128, heldout_tokens=128)

def test_widget_on_token_ids(ex):
    assert ex.data.calib_lengths == [128, 256] and ex.data.head_dim == 16 and ex.data.map_tokens[0].isdigit()
    ex.layer.value, ex.head.value = 1, 3
    assert ex.kernel_figure.layout.title.text.startswith('layer 1, head 3')
    ex.tokens.value, ex.multiplier.value = 128, 0.5
    assert math.isclose(ex.view['half_life'], max(0.5 * ex.view['mean_distance'], 0.5), rel_tol=1e-4)
    ex.run.click()
    r = ex.runs[0]
    assert r['settings'].tokens == 128 and all(math.isfinite(r[k]) for k in ('mse_copy', 'mse_phase1', 'cos_copy', 'cos_phase1'))
    assert f"{r['mse_phase1']:.4g}" in ex.fit.value

_DRIVE = r'''
<pre id="result">pending</pre>
<script>
function sleep(ms) { return new Promise(r => setTimeout(r, ms)); }
function click(el) { var b = el.getBoundingClientRect();
  el.dispatchEvent(new MouseEvent('click', {bubbles: true, view: window, clientX: b.left + b.width / 2, clientY: b.top + b.height / 2})); }
(async function() {
  var gd = document.getElementById('fig'), f = FIG, out = {};
  try {
    await Plotly.newPlot(gd, f.data, f.layout);
    click(gd.querySelector('.updatemenu-header')); await sleep(300);
    var entries = gd.querySelectorAll('.updatemenu-dropdown-button');
    out.entries = entries.length;
    click(entries[PICK]); await sleep(500);
    out.title = gd.layout.title.text;
    out.teacher = Array.from(gd.data[4].y);
    out.slider_title0 = gd._fullLayout.sliders[0].steps[0].args[1]['title.text'];
    var a = gd._fullLayout.sliders[0].steps[0].args;   // what dragging the slider to its first step runs
    await Plotly.update(gd, a[0], a[1], a[2]);
    out.title_after = gd.layout.title.text;
    out.memory = Array.from(gd.data[5].y);
    out.teacher_after = Array.from(gd.data[4].y);
    var shown = () => gd.data.map((t, i) => [t.name, t.visible !== false && t.visible !== 'legendonly']);
    out.shown_before = shown();
    var b = gd._fullLayout.sliders[1].steps[0].args;   // what dragging the beta slider to its first step runs
    await Plotly.restyle(gd, b[0], b[1]);
    out.shown_after = shown();
  } catch (e) { out.error = String(e); }
  document.getElementById('result').textContent = JSON.stringify(out);
})();
</script>'''

@pytest.mark.skipif(CHROMIUM is None, reason='Chromium is not installed')
def test_static_twin_in_chromium(ex, tmp_path):
    stats = ex.data.stats()
    fig = explorer_figure(stats, ex.data.seq_len, ex.data.head_dim)
    assert len(fig.layout.updatemenus[0].buttons) == 2 * 4 and len(fig.layout.sliders[0].steps) == len(DOCS_MULTIPLIERS)
    shutil.copy(Path(plotly.__file__).parent/'package_data'/'plotly.min.js', tmp_path/'plotly.min.js')
    page = tmp_path/'page.html'
    page.write_text('<html><head><meta charset="utf-8"><script src="plotly.min.js"></script></head><body>'
                    '<div id="fig" style="width:1100px;height:660px"></div>'
                    + _DRIVE.replace('FIG', fig.to_json()).replace('PICK', '6') + '</body></html>', encoding='utf-8')
    dom = subprocess.run([CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--virtual-time-budget=20000',
                          f'--user-data-dir={tmp_path/"profile"}', '--dump-dom', page.as_uri()],
                         capture_output=True, text=True, timeout=180).stdout
    out = json.loads(re.search(r'<pre id="result">(.*?)</pre>', dom, re.S).group(1))
    assert 'error' not in out, out
    assert out['entries'] == 8
    assert out['title'].startswith('layer 1, head 2') and out['slider_title0'].startswith('layer 1, head 2')   # entry 6
    want = kernel_view(stats, 1, 2, ex.data.seq_len, ex.data.head_dim, multiplier=DOCS_MULTIPLIERS[0])
    assert f"{DOCS_MULTIPLIERS[0]:.2f} × d_h" in out['title_after']                          # the slider moved the half-life ...
    assert out['memory'] == pytest.approx(want['memory_profile'], rel=1e-3, abs=1e-6)
    assert out['teacher_after'] == out['teacher'] == pytest.approx(want['teacher_profile'], rel=1e-3, abs=1e-6)  # ... not the teacher
    readable = lambda shown: [n for n, vis in shown if vis and n.startswith('readable')]
    lo, span = DOCS_BETAS[0]
    assert len(readable(out['shown_before'])) == 1 and len(readable(out['shown_after'])) == 1, out   # one beta setting drawn at a time
    assert readable(out['shown_after']) != readable(out['shown_before'])                            # the beta slider switched it ...
    assert f'{lo:.2f}' in readable(out['shown_after'])[0] and f'{span:.2f}' in readable(out['shown_after'])[0]   # ... to its first setting
