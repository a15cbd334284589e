"Recovery distillation: exact resume after a crash, crash-safe checkpoint writes, code-free checkpoint files, gradient accumulation, schedules, bad input, data parallelism."
import copy, hashlib, json, math, os, pickle, shutil, subprocess, sys
from pathlib import Path
import pytest, torch
from safetensors.torch import load_file, load_model
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
    assert D.read_checkpoint(tmp_path/'ckpt')['state']['step'] == 12

    resumed = perturbed(teacher, attention_dropout=0.2)            # a new process starts from the untrained student
    log_resumed = run(resumed, teacher, data, 14, checkpoint_dir=tmp_path, **kw)
    assert same_params(straight, resumed)
    for f in ('tokens_seen', 'train_kl', 'grad_norm', 'eval_tokens', 'eval_ppl', 'teacher_ppl'):
        assert getattr(log_resumed, f) == getattr(log_straight, f), f
    assert log_resumed.eval_tokens == [s * TOKENS_PER_STEP for s in (0, 3, 6, 9, 12, 14)]


def test_crash_during_checkpoint_write_keeps_previous(teacher, data, tmp_path, monkeypatch):
    "An error while ckpt.tmp is half written (inside accelerate's save_state) leaves ckpt loadable; the next run resumes from it exactly."
    import accelerate.checkpointing as AC
    straight = perturbed(teacher)
    run(straight, teacher, data, 6)
    first = perturbed(teacher)
    run(first, teacher, data, 4, checkpoint_dir=tmp_path)
    four = {k: v.clone() for k, v in first.state_dict().items()}

    real = AC.save
    def failing(obj, f, *args, **kwargs):
        if Path(f).name == 'optimizer.bin': raise OSError('disk full (simulated)')
        return real(obj, f, *args, **kwargs)
    monkeypatch.setattr(AC, 'save', failing)
    with pytest.raises(OSError, match='simulated'): run(perturbed(teacher), teacher, data, 6, checkpoint_dir=tmp_path,
                                                       checkpoint_every_tokens=TOKENS_PER_STEP)
    tmp = tmp_path/'ckpt.tmp'
    assert (tmp/'model.safetensors').exists() and not (tmp/'state.json').exists()   # the partial write is there ...
    assert D.latest_checkpoint(tmp_path) == tmp_path/'ckpt'                        # ... and ignored
    probe = perturbed(teacher)
    saved = D.load_checkpoint(tmp_path/'ckpt', probe)
    assert saved['state']['step'] == 4 and all(torch.equal(v, four[k]) for k, v in probe.state_dict().items())

    monkeypatch.setattr(AC, 'save', real)
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
    assert not (tmp_path/'ckpt').exists() and (tmp_path/'ckpt.old'/'state.json').exists()
    assert D.latest_checkpoint(tmp_path) == tmp_path/'ckpt.old'
    assert D.read_checkpoint(tmp_path/'ckpt.old')['state']['step'] == 3
    resumed = perturbed(teacher)
    run(resumed, teacher, data, 5, checkpoint_dir=tmp_path)
    assert same_params(straight, resumed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['ckpt']


CKPT_FILES = ['log.json', 'model.safetensors', 'optimizer.bin', 'random_states_0.pkl', 'scheduler.bin', 'state.json']

def test_checkpoint_files_load_without_code_with_tied_weights_and_two_lr_groups(teacher, data, tmp_path):
    "accelerate's save_state files: tensors in safetensors, the rest loadable with weights_only=True (NumPy arrays allow-listed for the RNG file)."
    from accelerate.utils import load as accelerate_load
    student = perturbed(teacher)
    run(student, teacher, data, 2, checkpoint_dir=tmp_path, lr_mixer=2e-4, lr_rest=3e-6)
    ck = tmp_path/'ckpt'
    assert sorted(p.name for p in ck.iterdir()) == CKPT_FILES
    opt = torch.load(ck/'optimizer.bin', weights_only=True)
    sched = torch.load(ck/'scheduler.bin', weights_only=True)
    assert sched['last_epoch'] == 2 and sched['base_lrs'] == [2e-4, 3e-6]
    with pytest.raises(pickle.UnpicklingError): torch.load(ck/'random_states_0.pkl', weights_only=True)   # NumPy's generator state ...
    rng = accelerate_load(ck/'random_states_0.pkl')            # ... loads once NumPy arrays are allow-listed, still weights_only
    assert torch.equal(rng['torch_manual_seed'], torch.get_rng_state())   # the state the run ended with
    json.loads((ck/'log.json').read_text()); json.loads((ck/'state.json').read_text())
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
    "The teacher comes back as it was (weights, training flag, requires_grad flags); the student is the caller's module with its class's forward."
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    teacher.train()
    teacher.model.norm.weight.requires_grad_(False)   # a mixed pattern of flags must survive
    flags = [p.requires_grad for p in teacher.parameters()]
    student = perturbed(teacher)
    s0 = {k: v.clone() for k, v in student.state_dict().items()}
    log = run(student, teacher, data, 3, ce_weight=0.5)
    assert teacher.training   # mode restored
    assert [p.requires_grad for p in teacher.parameters()] == flags
    teacher.model.norm.weight.requires_grad_(True); teacher.eval()
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())
    assert all(p.grad is None for p in teacher.parameters())
    assert not all(torch.equal(v, s0[k]) for k, v in student.state_dict().items())
    assert len(log.train_kl) == 3 and log.tokens_seen == [64, 128, 192] and log.eval_ppl == [] and log.lr == [1e-3] * 3
    assert 'forward' not in student.__dict__ and student.forward.__func__ is type(student).forward


def test_grad_accum_equals_a_larger_batch(teacher, data):
    "grad_accum=2 with batch b: the same tokens per step, training KL and weights (float tolerance) as grad_accum=1 with batch 2b."
    two_micro, one_batch = perturbed(teacher), perturbed(teacher)
    log_acc = run(two_micro, teacher, data, 5, batch_size=BS // 2, grad_accum=2, ce_weight=0.5)
    log_one = run(one_batch, teacher, data, 5, ce_weight=0.5)
    assert log_acc.tokens_seen == log_one.tokens_seen == [s * TOKENS_PER_STEP for s in range(1, 6)]
    assert log_acc.config['tokens_per_step'] == TOKENS_PER_STEP and log_acc.config['grad_accum'] == 2
    assert max(abs(a - b) for a, b in zip(log_acc.train_kl, log_one.train_kl)) < 1e-5
    assert max(abs(a - b) for a, b in zip(log_acc.grad_norm, log_one.grad_norm)) < 1e-4
    assert max((a - b).abs().max().item() for a, b in zip(two_micro.parameters(), one_batch.parameters())) < 1e-5


def test_cosine_schedule_with_warmup_and_exact_resume(teacher, data, tmp_path):
    "Rates per step follow linear warm-up then cosine; a crash mid-accumulation and a resume continue the schedule exactly."
    kw = dict(batch_size=BS // 2, grad_accum=2, schedule='cosine', warmup_tokens=3 * TOKENS_PER_STEP,
              checkpoint_every_tokens=4 * TOKENS_PER_STEP)
    straight = perturbed(teacher, attention_dropout=0.2)
    log_straight = run(straight, teacher, data, 12, **kw)
    W, T = 3, 12
    want = [1e-3 * (s / W if s < W else 0.5 * (1 + math.cos(math.pi * (s - W) / (T - W)))) for s in range(T)]
    assert log_straight.config['warmup_steps'] == W and log_straight.config['schedule_steps'] == T
    assert max(abs(a - b) for a, b in zip(log_straight.lr, want)) < 1e-15 and log_straight.lr[0] == 0.0

    crashing, calls = perturbed(teacher, attention_dropout=0.2), []
    def boom(mod, args, kwargs):
        if mod.training:
            calls.append(1)
            if len(calls) == 2 * 9 + 1: raise RuntimeError('simulated crash')   # first micro-batch of step 10, last checkpoint at step 8
    h = crashing.register_forward_pre_hook(boom, with_kwargs=True)
    with pytest.raises(RuntimeError, match='simulated crash'): run(crashing, teacher, data, 12, checkpoint_dir=tmp_path, **kw)
    h.remove()
    assert D.read_checkpoint(tmp_path/'ckpt')['state']['step'] == 8
    resumed = perturbed(teacher, attention_dropout=0.2)
    log_resumed = run(resumed, teacher, data, 12, checkpoint_dir=tmp_path, **kw)
    assert same_params(straight, resumed)
    for f in ('lr', 'tokens_seen', 'train_kl', 'grad_norm'): assert getattr(log_resumed, f) == getattr(log_straight, f), f
    with pytest.raises(ValueError, match=r'cannot resume.*schedule_steps: checkpoint 12, now 16'):   # a decaying schedule fixes the budget
        run(perturbed(teacher), teacher, data, 16, checkpoint_dir=tmp_path, **kw)


def digest(d):
    "A hash of every file under `d` (names and bytes)."
    h = hashlib.sha256()
    for f in sorted(Path(d).rglob('*')):
        if f.is_file(): h.update(str(f.relative_to(d)).encode()); h.update(f.read_bytes())
    return h.hexdigest()

def test_bad_input(teacher, data, tmp_path):
    s = perturbed(teacher)
    for tokens in (0, -5, 1.5):
        with pytest.raises(ValueError, match='tokens must be a positive integer'):
            D.distill(s, teacher, data, tokens=tokens, seq_len=SEQ, progress=False)
    with pytest.raises(ValueError, match='shorter than seq_len'): D.distill(s, teacher, data.flatten()[:10], tokens=100, seq_len=SEQ)
    with pytest.raises(ValueError, match='shorter than seq_len'): D.distill(s, teacher, data, tokens=100, seq_len=2 * SEQ)
    with pytest.raises(ValueError, match='integer tensor'): D.distill(s, teacher, data.float(), tokens=100, seq_len=SEQ)
    with pytest.raises(ValueError, match='mixed_precision'): run(s, teacher, data, 1, mixed_precision='fp64')
    with pytest.raises(ValueError, match='without eval_data'): run(s, teacher, data, 1, eval_every_tokens=64)
    with pytest.raises(ValueError, match='fewer than one global batch'): run(s, teacher, data[:3], 1)
    with pytest.raises(ValueError, match=r'fewer than one global batch \(4 x 1 process\(es\) x 11 micro'): run(s, teacher, data, 1, grad_accum=11)
    import numpy as np
    assert run(s, teacher, data, 1, tokens=np.int64(2 * TOKENS_PER_STEP)).tokens_seen == [64, 128]   # numpy integers are fine

    run(s, teacher, data, 1, checkpoint_dir=tmp_path)
    ck = digest(tmp_path)
    deeper = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    wider = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    fewer_heads = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    bad = [(dict(seed=1), r'cannot resume.*seed: checkpoint 0, now 1'),                      # another run's checkpoint
           (dict(data=data.flip(0)), r'cannot resume.*data: checkpoint'),
           (dict(lr_mixer=2e-3), r'cannot resume.*lr_mixer'),
           (dict(batch_size=2, grad_accum=2), r'cannot resume.*batch_size.*grad_accum'),    # same tokens per step, other data positions
           (dict(teacher=tiny(0, vocab_size=80)), 'vocabulary mismatch'),
           (dict(teacher=deeper), r'differ in shape \(num_hidden_layers 2 vs 3'),
           (dict(teacher=wider), r'differ in shape \(hidden_size 32 vs 64'),
           (dict(teacher=fewer_heads), r'differ in shape \(num_attention_heads 4 vs 2; num_key_value_heads 2 vs 1'),
           (dict(grad_accum=0), 'grad_accum must be a positive integer, got 0'),
           (dict(grad_accum=1.5), 'grad_accum must be a positive integer'),
           (dict(schedule='sawtooth'), "schedule must be one of constant, constant_with_warmup, linear, cosine, inverse_sqrt, got 'sawtooth'"),
           (dict(warmup_tokens=64), "schedule 'constant' has no warm-up"),
           (dict(schedule='cosine', warmup_tokens=10_000), r'warmup_tokens \(10000\) exceeds the budget'),
           (dict(schedule='cosine', warmup_tokens=-1), 'warmup_tokens must be a non-negative integer')]
    for kw, msg in bad:
        kw = dict(teacher=teacher, data=data) | kw
        with pytest.raises(ValueError, match=msg) as e: run(s, kw.pop('teacher'), kw.pop('data'), 2, checkpoint_dir=tmp_path, **kw)
        assert '\n' not in str(e.value)
        assert digest(tmp_path) == ck, kw   # the checkpoint is untouched
    (tmp_path/'other').mkdir(); (tmp_path/'other'/'ckpt').mkdir(); (tmp_path/'other'/'ckpt'/'state.pt').write_bytes(b'x')
    with pytest.raises(ValueError, match='has no state.json: not a checkpoint written by distill'):
        run(s, teacher, data, 1, checkpoint_dir=tmp_path/'other')
    shutil.rmtree(tmp_path/'other')
    run(s, teacher, data, 2, checkpoint_dir=tmp_path, seed=1, resume=False)   # explicit fresh start overwrites
    assert D.read_checkpoint(tmp_path/'ckpt')['state']['config']['seed'] == 1


def test_launch_that_accelerate_did_not_join_is_refused(teacher, data, tmp_path, monkeypatch):
    "Processes a launcher started that accelerate runs alone (an FSDP config on a machine without GPUs) would overwrite one checkpoint: refused."
    run(perturbed(teacher), teacher, data, 1, checkpoint_dir=tmp_path)
    ck = digest(tmp_path)
    monkeypatch.setenv('WORLD_SIZE', '2')
    with pytest.raises(ValueError, match='2 processes were launched but accelerate runs each one alone'):
        run(perturbed(teacher), teacher, data, 2, checkpoint_dir=tmp_path)
    assert digest(tmp_path) == ck
    monkeypatch.delenv('WORLD_SIZE')
    monkeypatch.setenv('ACCELERATE_USE_FSDP', 'true')   # FSDP asked for, but accelerate runs without it on a CPU: a warning, and it trains
    with pytest.warns(UserWarning, match='FSDP was configured but accelerate runs'):
        assert run(perturbed(teacher), teacher, data, 1).tokens_seen == [64]
    monkeypatch.setenv('ACCELERATE_GRADIENT_ACCUMULATION_STEPS', '4')
    with pytest.raises(ValueError, match='configured for 4 gradient accumulation steps but grad_accum=1'): run(perturbed(teacher), teacher, data, 1)


def test_fsdp_config_file_makes_an_fsdp2_plugin(root, monkeypatch):
    "bench/accelerate_fsdp.yaml, read as accelerate launch reads it, gives FSDP2 with per-layer wrapping and sharded state dicts."
    from accelerate.commands.launch import launch_command_parser, _validate_launch_command
    from accelerate.utils.launch import prepare_multi_gpu_env
    from accelerate.utils import FullyShardedDataParallelPlugin
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(['--config_file', str(root/'bench'/'accelerate_fsdp.yaml'), 'x.py']))
    env = prepare_multi_gpu_env(args)
    assert env['ACCELERATE_USE_FSDP'] == 'true' and env['ACCELERATE_MIXED_PRECISION'] == 'bf16'
    for k, v in env.items():
        if k.startswith('FSDP_'): monkeypatch.setenv(k, v)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.state_dict_type.name == 'SHARDED_STATE_DICT' and plugin.auto_wrap_policy.__name__ == 'transformer_auto_wrap_policy'


DDP_SCRIPT = '''
import sys, torch
torch.set_num_threads(1)
sys.path.insert(0, {tests!r})
from test_distill import tiny, perturbed, run, TOKENS_PER_STEP
from taylor_calibrate.distill import read_checkpoint
from safetensors.torch import save_model
from accelerate import PartialState
def say(*parts):   # one write of a whole line: the two ranks share stdout, and print's pieces could interleave
    sys.stdout.write(' '.join(map(str, parts)) + chr(10)); sys.stdout.flush()
teacher = tiny(0).eval()
data = torch.randint(0, 64, (40, 16), generator=torch.Generator().manual_seed(0))
out, ck = sys.argv[1], sys.argv[2]
run(perturbed(teacher), teacher, data, 2, batch_size=2, checkpoint_dir=ck)         # stop after 2 global steps ...
main = PartialState().is_main_process   # after distill's Accelerator: a bare PartialState() would not read ACCELERATE_USE_CPU
student = perturbed(teacher)
log = run(student, teacher, data, 5, batch_size=2, checkpoint_dir=ck)              # ... and resume to 5
if main: save_model(student, out + '/ddp.safetensors'); say('processes', log.config['num_processes'], 'tokens', log.tokens_seen)
accum = perturbed(teacher)
log = run(accum, teacher, data, 5, batch_size=1, grad_accum=2)                     # 1 window x 2 processes x 2 micro-batches
if main: save_model(accum, out + '/accum.safetensors'); say('accum tokens', log.tokens_seen)
kw = dict(batch_size=1, grad_accum=2, schedule='linear', warmup_tokens=2 * TOKENS_PER_STEP, checkpoint_every_tokens=3 * TOKENS_PER_STEP)
straight = perturbed(teacher, attention_dropout=0.2)                               # dropout: every process's generator must come back
log_straight = run(straight, teacher, data, 6, **kw)
calls = []
def boom(mod, args):
    if mod.training:
        calls.append(1)
        if len(calls) == 2 * 4 + 2: raise RuntimeError('simulated crash')           # second micro-batch of step 5, checkpoint at step 3
crashing = perturbed(teacher, attention_dropout=0.2)
crashing.register_forward_pre_hook(boom)
try: run(crashing, teacher, data, 6, checkpoint_dir=ck + '-crash', **kw)
except RuntimeError as e: say('rank', PartialState().process_index, e, 'after step', read_checkpoint(ck + '-crash/ckpt')['state']['step'])
resumed = perturbed(teacher, attention_dropout=0.2)
log_resumed = run(resumed, teacher, data, 6, checkpoint_dir=ck + '-crash', **kw)
same = all(torch.equal(a, b) for a, b in zip(straight.parameters(), resumed.parameters()))
same_log = all(getattr(log_resumed, f) == getattr(log_straight, f) for f in ('lr', 'train_kl', 'grad_norm', 'tokens_seen'))
say('rank', PartialState().process_index, 'resumed bitwise', same, same_log)
'''

DDP_CKPT_FILES = ['log.json', 'model.safetensors', 'optimizer.bin', 'random_states_0.pkl', 'random_states_1.pkl', 'scheduler.bin', 'state.json']

@pytest.mark.skipif(shutil.which('torchrun', path=str(Path(sys.executable).parent)) is None, reason='torchrun not installed')
def test_two_process_data_parallel_matches_one_process(teacher, data, tmp_path):
    "torchrun, 2 CPU processes (gloo): batch 2 each stopped and resumed, and batch 1 x 2 micro-batches, equal 1 process with batch 4; a crash resumes bit for bit."
    script = tmp_path/'ddp.py'
    script.write_text(DDP_SCRIPT.format(tests=str(Path(__file__).parent)))
    env = dict(os.environ, ACCELERATE_USE_CPU='true', OMP_NUM_THREADS='1')
    r = subprocess.run([str(Path(sys.executable).parent/'torchrun'), '--standalone', '--nproc_per_node', '2', str(script),
                        str(tmp_path), str(tmp_path/'ck')], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [s * TOKENS_PER_STEP for s in range(1, 6)]
    assert f'processes 2 tokens {steps}' in r.stdout and f'accum tokens {steps}' in r.stdout
    assert 'rank 0 simulated crash after step 3' in r.stdout and 'rank 1 simulated crash after step 3' in r.stdout, r.stdout
    assert 'rank 0 resumed bitwise True True' in r.stdout and 'rank 1 resumed bitwise True True' in r.stdout, r.stdout
    single = perturbed(teacher)
    run(single, teacher, data, 5)
    for name in ('ddp', 'accum'):
        ddp = load_file(tmp_path/f'{name}.safetensors')
        ref = {k: v for k, v in single.state_dict().items() if k in ddp}
        assert max((ref[k] - ddp[k]).abs().max().item() for k in ref) < 1e-5, name
    ck = tmp_path/'ck'/'ckpt'
    assert sorted(p.name for p in ck.iterdir()) == DDP_CKPT_FILES
    plain = tiny(5)
    assert D.load_checkpoint(ck, plain)['state']['step'] == 5                      # the DDP wrapper's 'module.' names are read too
    written = tiny(6)
    load_model(written, str(tmp_path/'ddp.safetensors'))
    assert same_params(plain, written)
    before = digest(tmp_path/'ck')
    with pytest.raises(ValueError, match=r'cannot resume.*num_processes: checkpoint 2, now 1'):   # another world size
        run(perturbed(teacher), teacher, data, 6, batch_size=2, checkpoint_dir=tmp_path/'ck')
    assert digest(tmp_path/'ck') == before

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


def test_a_hybrid_of_another_kind_of_teacher_is_refused(teacher, data):
    from transformers import LlamaConfig, LlamaForCausalLM
    from taylor_calibrate.convert import to_hybrid
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    with pytest.raises(ValueError, match='the student is a hybrid converted from a llama model but the teacher is a qwen2 model') as e:
        run(to_hybrid(llama, [0]), teacher, data, 1)
    assert '\n' not in str(e.value)


def test_distilling_a_hybrid_that_shares_weights_leaves_the_teacher_alone(teacher, data):
    "A calibrated hybrid shares the teacher's unchanged weights (frozen); distill copies them first and then trains them all."
    from taylor_calibrate.convert import to_hybrid, shared_weights
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    s = to_hybrid(teacher, [0], share_weights=True)
    assert 'model.layers.0.mlp.up_proj.weight' in shared_weights(s)
    run(s, teacher, data, 3)
    assert shared_weights(s) == []
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    moved = {n for n, p in s.named_parameters() if n in before and not torch.equal(p, before[n])}
    assert {'model.layers.0.mlp.up_proj.weight', 'model.layers.0.self_attn.q_proj.weight', 'model.embed_tokens.weight'} <= moved
