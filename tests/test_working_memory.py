"""Working memory bounded by `windows.BATCH_BYTES`: the windowed steps agree with the whole-batch ones.

Every step of `calibrate` that runs the teacher or a GDN layer over the calibration windows takes `windows_at_once`
windows at a time; Phase 1's sums over all calibration tokens run window by window once they do not fit in
`BATCH_BYTES`, and Phase 2 accumulates its batch's gradient over parts. With `BATCH_BYTES` shrunk to one byte every
step runs one window at a time, and the calibrated layers must agree with the default (whole batches here) to
rounding. The shipped teachers must stay on the whole-batch paths, where the results are those of the code as
first written, to the bit. The tunable lives in `taylor_calibrate.windows`, where it is read; `core.BATCH_BYTES` reads and
sets the same value.
"""
import pytest, torch
import taylor_calibrate.core as core
import taylor_calibrate.windows as windows
import taylor_calibrate.gdn as gdn_module
from taylor_calibrate.convert import random_teacher, gdn_modules

torch.set_num_threads(1)


def calibrated(kind, init, **kw):
    teacher = random_teacher(kind, layers=4)
    ids = torch.randint(0, teacher.config.vocab_size, (12, 32), generator=torch.Generator().manual_seed(1))
    return core.calibrate(teacher, ids, keep=[0, 2], init=init, seq_len=32, calib_tokens=256, heldout_tokens=64, steps=3,
                          progress=False, **kw)


@pytest.mark.parametrize('kind,init', [('qwen3', 'taylor+'), ('qwen2', 'taylor'), ('llama', 'taylor+')])
def test_one_window_at_a_time_agrees_with_whole_batches(monkeypatch, kind, init):
    whole = calibrated(kind, init)
    monkeypatch.setattr(windows, 'BATCH_BYTES', 1)
    assert windows.windows_at_once(64, 32) == 1 and windows.windows_at_once(64, 32, tensors=2, most=8) == 1
    windowed = calibrated(kind, init)
    a, b = whole.calibration_report, windowed.calibration_report
    for ra, rb in zip(a.heads, b.heads):
        for k in ('sigma', 'alpha', 'beta', 'half_life', 'dt_bias'): assert ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-6, nan_ok=True), (k, ra, rb)   # NaN: a field the recipe does not set
    for la, lb in zip(a.layers, b.layers):
        for k in ('mse_phase1', 'mse_phase2'): assert la[k] == pytest.approx(lb[k], rel=1e-3), (k, la, lb)
    for l, g in gdn_modules(whole).items():
        for (n, p), q in zip(g.state_dict().items(), gdn_modules(windowed)[l].state_dict().values()):
            torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-5, msg=lambda m: f'layer {l} {n}: {m}')


def test_calibrate_caps_the_kernel_pool_and_keeps_no_gradients(monkeypatch):
    seen = []
    phase2 = core.phase2
    monkeypatch.setattr(core, 'phase2', lambda *a, **k: (seen.append(gdn_module._BUFFERS.max_bytes), phase2(*a, **k))[1])
    hybrid = calibrated('qwen2', 'taylor+')
    assert all(p.grad is None for p in hybrid.parameters())   # Phase 2 leaves no gradients behind
    assert seen and set(seen) == {windows.BATCH_BYTES}
    assert gdn_module._BUFFERS.max_bytes == 2 ** 30 and gdn_module._BUFFERS.bufs == []


@pytest.mark.parametrize('name', ['tiny-qwen2', 'tiny-qwen3'])
def test_shipped_teachers_stay_on_whole_batches(name):
    "At the recipes' budgets the shipped teachers run every step as before: eight windows, Phase 1's sums all at once."
    from transformers import AutoConfig
    from taylor_calibrate.teacher import teacher_dir
    c = AutoConfig.from_pretrained(teacher_dir(name))
    head_dim = getattr(c, 'head_dim', None) or c.hidden_size // c.num_attention_heads
    width = max(c.hidden_size, c.num_attention_heads * head_dim)
    assert windows.windows_at_once(c.hidden_size, 512) == windows.windows_at_once(width, 512) == 8
    n = core.get_recipe('taylor+').calib_tokens // 512
    assert windows.windows_at_once(width, 512, tensors=3, most=n) == n   # set_output_gate's whole path (set_value_scale needs 2)


@pytest.mark.parametrize('name,value', [('BATCH_BYTES', 1), ('CAPTURE_BUDGET', 0.), ('CAPTURE_FLOOR', 1)])
def test_core_reads_and_sets_the_tunables_of_windows(monkeypatch, name, value):
    "`core.BATCH_BYTES = x` (and the capture budget) sets the value `windows` reads, and `core` reads it back: one value, two names."
    default = getattr(windows, name)
    assert getattr(core, name) == default and name in core.__all__ and name in dir(core)
    monkeypatch.setattr(core, name, value)
    assert getattr(windows, name) == value == getattr(core, name) and name not in vars(core)
    monkeypatch.undo()
    assert getattr(windows, name) == default == getattr(core, name)


def test_batch_bytes_set_under_core_takes_effect(monkeypatch):
    monkeypatch.setattr(core, 'BATCH_BYTES', 1)
    assert windows.windows_at_once(256, 512) == core.windows_at_once(256, 512) == 1
