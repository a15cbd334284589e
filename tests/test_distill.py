"Recovery distillation: exact resume after a crash, crash-safe checkpoint writes, pickle-free files, bad input, data parallelism."
import copy, json, os, shutil, subprocess, sys
from pathlib import Path
import pytest, torch
from safetensors.torch import load_file, save_model
from transformers import Qwen2Config, Qwen2ForCausalLM
import taylor_calibrate.distill as D

torch.set_num_threads(1)
SEQ, BS = 16, 4
TOKENS_PER_STEP = SEQ * BS


def tiny(seed=0, vocab_size=64, attention_dropout=0.0):
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3,
                                        attention_dropout=attention_dropout, tie_word_embeddings=True))


def perturbed(teacher, seed=1, attention_dropout=0.0):
    "A copy of the teacher with noisy weights (and, optionally, attention dropout so that resume must restore the RNG)."
    s = copy.deepcopy(teacher)
    s.config.attention_dropout = attention_dropout
    for layer in s.model.layers: layer.self_attn.attention_dropout = attention_dropout
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in s.parameters(): p.add_(0.1 * torch.randn(p.shape, generator=g))
    return s.train()


@pytest.fixture(scope='module')
def teacher(): return tiny(0).eval()

@pytest.fixture(scope='module')
def data(): return torch.randint(0, 64, (40, SEQ), generator=torch.Generator().manual_seed(0))  # 10 steps per epoch

@pytest.fixture(scope='module')
def valid(): return torch.randint(0, 64, (4 * SEQ,), generator=torch.Generator().manual_seed(1))

def run(student, teacher, data, steps, **kw):
    kw = dict(tokens=steps * TOKENS_PER_STEP, seq_len=SEQ, batch_size=BS, lr_mixer=1e-3, lr_rest=1e-4, progress=False) | kw
    return D.distill(student, teacher, data, **kw)

def same_params(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_resume_after_crash_equals_uninterrupted(teacher, data, valid, tmp_path):
    "Kill a run mid-epoch, in the second step after a checkpoint; resuming on a fresh student gives the uninterrupted run bit for bit (dropout on)."
    kw = dict(eval_data=valid, eval_every_tokens=3 * TOKENS_PER_STEP, checkpoint_every_tokens=3 * TOKENS_PER_STEP)
    straight = perturbed(teacher, attention_dropout=0.2)
    log_straight = run(straight, teacher, data, 14, **kw)           # crosses an epoch boundary (10 steps per epoch)

    crashing, calls = perturbed(teacher, attention_dropout=0.2), []
    def boom(mod, args, kwargs):
        if mod.training:
            calls.append(1)
            if len(calls) == 14: raise RuntimeError('simulated crash')   # during step 14, last checkpoint at step 12
    h = crashing.register_forward_pre_hook(boom, with_kwargs=True)
    with pytest.raises(RuntimeError, match='simulated crash'): run(crashing, teacher, data, 14, checkpoint_dir=tmp_path, **kw)
    h.remove()
    assert torch.load(tmp_path/'ckpt'/'state.pt', weights_only=True)['step'] == 12

    resumed = perturbed(teacher, attention_dropout=0.2)            # a new process starts from the untrained student
    log_resumed = run(resumed, teacher, data, 14, checkpoint_dir=tmp_path, **kw)
    assert same_params(straight, resumed)
    for f in ('tokens_seen', 'train_kl', 'grad_norm', 'eval_tokens', 'eval_ppl', 'teacher_ppl'):
        assert getattr(log_resumed, f) == getattr(log_straight, f), f
    assert log_resumed.eval_tokens == [s * TOKENS_PER_STEP for s in (0, 3, 6, 9, 12, 14)]


def test_crash_during_checkpoint_write_keeps_previous(teacher, data, tmp_path, monkeypatch):
    "An error while ckpt.tmp is half written leaves ckpt loadable; the next run resumes from it and matches an uninterrupted run."
    straight = perturbed(teacher)
    run(straight, teacher, data, 6)
    first = perturbed(teacher)
    run(first, teacher, data, 4, checkpoint_dir=tmp_path)
    four = {k: v.clone() for k, v in first.state_dict().items()}

    real = D._save_tensors
    def failing(obj, path):
        if Path(path).name == 'optimizer.pt': raise OSError('disk full (simulated)')
        real(obj, path)
    monkeypatch.setattr(D, '_save_tensors', failing)
    with pytest.raises(OSError, match='simulated'): run(perturbed(teacher), teacher, data, 6, checkpoint_dir=tmp_path,
                                                       checkpoint_every_tokens=TOKENS_PER_STEP)
    tmp = tmp_path/'ckpt.tmp'
    assert (tmp/'model.safetensors').exists() and not (tmp/'state.pt').exists()   # the partial write is there ...
    assert D.latest_checkpoint(tmp_path) == tmp_path/'ckpt'                       # ... and ignored
    probe = perturbed(teacher)
    saved = D.load_checkpoint(tmp_path/'ckpt', probe)
    assert saved['state']['step'] == 4 and all(torch.equal(v, four[k]) for k, v in probe.state_dict().items())

    monkeypatch.setattr(D, '_save_tensors', real)
    resumed = perturbed(teacher)
    run(resumed, teacher, data, 6, checkpoint_dir=tmp_path)
    assert same_params(straight, resumed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['ckpt']


def test_crash_between_renames_falls_back_to_old(teacher, data, tmp_path, monkeypatch):
    "If the process dies after ckpt -> ckpt.old but before ckpt.tmp -> ckpt, the previous checkpoint (ckpt.old) is used."
    straight = perturbed(teacher)
    run(straight, teacher, data, 5)
    run(perturbed(teacher), teacher, data, 3, checkpoint_dir=tmp_path)
    real = os.replace
    def dying(src, dst):
        if Path(src).name == 'ckpt.tmp': raise KeyboardInterrupt('killed between renames (simulated)')
        real(src, dst)
    monkeypatch.setattr(D.os, 'replace', dying)
    with pytest.raises(KeyboardInterrupt): run(perturbed(teacher), teacher, data, 5, checkpoint_dir=tmp_path)
    monkeypatch.setattr(D.os, 'replace', real)
    assert not (tmp_path/'ckpt').exists() and (tmp_path/'ckpt.old'/'state.pt').exists()
    assert D.latest_checkpoint(tmp_path) == tmp_path/'ckpt.old'
    assert torch.load(tmp_path/'ckpt.old'/'state.pt', weights_only=True)['step'] == 3
    resumed = perturbed(teacher)
    run(resumed, teacher, data, 5, checkpoint_dir=tmp_path)
    assert same_params(straight, resumed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['ckpt']


def test_checkpoint_is_pickle_free_with_tied_weights_and_two_lr_groups(teacher, data, tmp_path):
    student = perturbed(teacher)
    run(student, teacher, data, 2, checkpoint_dir=tmp_path, lr_mixer=2e-4, lr_rest=3e-6)
    ck = tmp_path/'ckpt'
    assert sorted(p.name for p in ck.iterdir()) == ['log.json', 'model.safetensors', 'optimizer.pt', 'rng_0.pt', 'state.pt']
    opt = torch.load(ck/'optimizer.pt', weights_only=True)
    torch.load(ck/'rng_0.pt', weights_only=True); torch.load(ck/'state.pt', weights_only=True)
    json.loads((ck/'log.json').read_text())
    groups = {g['name']: g for g in opt['param_groups']}
    assert groups['mixer']['lr'] == 2e-4 and groups['rest']['lr'] == 3e-6
    assert len(groups['mixer']['params']) == len(D.mixer_parameter_names(student)) == 14
    assert len(groups['mixer']['params']) + len(groups['rest']['params']) == len(list(student.parameters()))
    assert len(load_file(ck/'model.safetensors')) == len(list(student.parameters()))   # the tied matrix once
    fresh = tiny(5)
    D.load_checkpoint(ck, fresh)
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight
    assert same_params(student, fresh)


def test_teacher_is_frozen_and_only_the_student_moves(teacher, data):
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    teacher.train()
    student = perturbed(teacher)
    s0 = {k: v.clone() for k, v in student.state_dict().items()}
    log = run(student, teacher, data, 3, ce_weight=0.5)
    assert teacher.training   # mode restored
    teacher.eval()
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())
    assert all(p.grad is None for p in teacher.parameters())
    assert not all(torch.equal(v, s0[k]) for k, v in student.state_dict().items())
    assert len(log.train_kl) == 3 and log.tokens_seen == [64, 128, 192] and log.eval_ppl == []
    assert 'forward' not in student.__dict__


def test_bad_input(teacher, data, tmp_path):
    s = perturbed(teacher)
    for tokens in (0, -5, 1.5):
        with pytest.raises(ValueError, match='tokens must be a positive integer'):
            D.distill(s, teacher, data, tokens=tokens, seq_len=SEQ, progress=False)
    with pytest.raises(ValueError, match='shorter than seq_len'): D.distill(s, teacher, data.flatten()[:10], tokens=100, seq_len=SEQ)
    with pytest.raises(ValueError, match='shorter than seq_len'): D.distill(s, teacher, data, tokens=100, seq_len=2 * SEQ)
    with pytest.raises(ValueError, match='vocabulary mismatch'): D.distill(s, tiny(0, vocab_size=80), data, tokens=100, seq_len=SEQ)
    with pytest.raises(ValueError, match='integer tensor'): D.distill(s, teacher, data.float(), tokens=100, seq_len=SEQ)
    with pytest.raises(ValueError, match='mixed_precision'): run(s, teacher, data, 1, mixed_precision='fp64')
    with pytest.raises(ValueError, match='without eval_data'): run(s, teacher, data, 1, eval_every_tokens=64)
    with pytest.raises(ValueError, match='fewer than one global batch'): run(s, teacher, data[:3], 1)
    import numpy as np
    assert run(s, teacher, data, 1, tokens=np.int64(2 * TOKENS_PER_STEP)).tokens_seen == [64, 128]   # numpy integers are fine
    run(s, teacher, data, 1, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match='cannot resume.*seed'): run(s, teacher, data, 2, checkpoint_dir=tmp_path, seed=1)
    run(s, teacher, data, 2, checkpoint_dir=tmp_path, seed=1, resume=False)   # explicit fresh start overwrites
    assert torch.load(tmp_path/'ckpt'/'state.pt', weights_only=True)['config']['seed'] == 1


DDP_SCRIPT = '''
import sys, torch
torch.set_num_threads(1)
sys.path.insert(0, {tests!r})
from test_distill import tiny, perturbed, run, TOKENS_PER_STEP
from safetensors.torch import save_model
teacher = tiny(0).eval()
data = torch.randint(0, 64, (40, 16), generator=torch.Generator().manual_seed(0))
out, ck = sys.argv[1], sys.argv[2]
run(perturbed(teacher), teacher, data, 2, batch_size=2, checkpoint_dir=ck)         # stop after 2 global steps ...
student = perturbed(teacher)
log = run(student, teacher, data, 5, batch_size=2, checkpoint_dir=ck)              # ... and resume to 5
from accelerate import PartialState
if PartialState().is_main_process:
    save_model(student, out); print('processes', log.config['num_processes'], 'tokens', log.tokens_seen)
'''

@pytest.mark.skipif(shutil.which('torchrun', path=str(Path(sys.executable).parent)) is None, reason='torchrun not installed')
def test_two_process_data_parallel_matches_one_process(teacher, data, tmp_path):
    "torchrun with 2 CPU processes (gloo), batch 2 each, stopped and resumed, equals 1 process with batch 4 (float tolerance)."
    script = tmp_path/'ddp.py'
    script.write_text(DDP_SCRIPT.format(tests=str(Path(__file__).parent)))
    env = dict(os.environ, ACCELERATE_USE_CPU='true', OMP_NUM_THREADS='1')
    r = subprocess.run([str(Path(sys.executable).parent/'torchrun'), '--standalone', '--nproc_per_node', '2', str(script),
                        str(tmp_path/'ddp.safetensors'), str(tmp_path/'ck')], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f'processes 2 tokens {[s * TOKENS_PER_STEP for s in range(1, 6)]}' in r.stdout
    single = perturbed(teacher)
    run(single, teacher, data, 5)
    ddp = load_file(tmp_path/'ddp.safetensors')
    ref = {k: v for k, v in single.state_dict().items() if k in ddp}
    assert max((ref[k] - ddp[k]).abs().max().item() for k in ref) < 1e-5
    assert sorted(p.name for p in (tmp_path/'ck'/'ckpt').iterdir()) == ['log.json', 'model.safetensors', 'optimizer.pt',
                                                                          'rng_0.pt', 'rng_1.pt', 'state.pt']



def test_bf16_autocast_path_on_cpu(teacher, data):
    "The GPU's mixed-precision path (accelerate bf16 autocast), run on the CPU: it trains, and leaves student.forward clean."
    from accelerate.state import AcceleratorState
    AcceleratorState._reset_state(reset_partial_state=True)   # the process-wide state was fixed to 'no' by the tests above
    try:
        student = perturbed(teacher)
        log = run(student, teacher, data, 20, mixed_precision='bf16', eval_data=data[:4].flatten(), eval_every_tokens=10 * TOKENS_PER_STEP)
    finally: AcceleratorState._reset_state(reset_partial_state=True)
    assert log.config['mixed_precision'] == 'bf16' and next(student.parameters()).dtype == torch.float32
    assert 'forward' not in student.__dict__ and '_original_forward' not in student.__dict__   # autocast wrapper removed
    assert log.train_kl[-1] < log.train_kl[0] and log.eval_ppl[-1] < log.eval_ppl[0]
