"""Run an `export_hybrid` export in llama.cpp and compare its logits with stock transformers.

What it checks. `taylor_calibrate.convert.export_hybrid` writes a hybrid as transformers' native `qwen3_5_text`
(`Qwen3_5ForCausalLM`: Gated DeltaNet "linear_attention" layers plus gated full attention, `layer_types` in config.json).
This script takes the llama.cpp vendored in the llama-cpp-python 0.3.36 source distribution, converts exports with its
own `convert_hf_to_gguf.py` (f32 GGUF, so that only the mapping is tested, not rounding), runs them with its own CPU
runtime through the llama-cpp-python bindings, and compares, at every position of a few random token sequences, the
logits and log-probabilities with those of stock transformers (fp32, its PyTorch delta rule: flash-linear-attention
hidden) on the same export directory. Two exports:

* `random-qwen3`: a random Qwen3 teacher (hidden 256, 4 query heads x 64, 2 KV heads, 4 layers, the shipped
  tokenizer's vocabulary), norm weights drawn in [0.5, 1.5] (q/k norms included), converted with layer 0 kept,
  a real short convolution (`use_short_conv=True`) and GDN dynamics (A_log, dt_bias, beta and gate weights) set away
  from their defaults; untied embeddings; rotary over all 64 dimensions.
* `tiny-qwen3`: the shipped 12-layer `tiny-qwen3` teacher (head_dim 32, tied embeddings, rms_norm_eps 1e-6, so
  the export rescales the residual stream), layers 3, 7 and 11 kept, identity convolution, dynamics set as above.

Each sequence is run three ways in llama.cpp: in one batch (prefill), half in one batch then one token at a time
(the recurrent state and KV cache carried over), and greedy generation of 16 tokens, which is compared with
transformers' `generate(do_sample=False)`. Two negative controls (transformers on the same export with one piece of
the mapping deliberately misread: the zero-centred norms read as plain weights, the attention gate's 1/2 dropped) show
that the tolerance is far below what a mapping error produces. A bf16 GGUF is also measured, for information only
(that is the rounding of the weights, not the mapping). The exports have as many GDN value heads as key heads, so the
converter's regrouping of value heads (done only when the counts differ) is not exercised.

The converter does not take an export as it is: it asserts that a Qwen3.5 checkpoint has multi-token-prediction
layers (`--no-mtp` skips that), and it refuses the shipped BPE tokenizer, whose pre-tokenizer it identifies by a hash
of token ids; that pre-tokenizer's regex is Qwen2's, so the script then runs the converter with the pre-tokenizer
pinned to 'qwen2' (after checking the regex). What each try said is in the JSON (`convert.tries`).

Tolerance: max |log-prob difference| <= 1e-4 at every position, every argmax equal and the same greedy tokens.
With f32 weights, an f32 KV cache and fp32 transformers only the order of floating-point operations differs:
the measured differences are about 1e-5, while each negative control moves log-probs by more than 2.

How to run (from the repository root, with the project's venv; low priority, one core):

    nice -n 10 .venv/bin/python bench/llama_cpp_check.py [--out bench/results/llama_cpp_check.json]

The first run downloads the llama-cpp-python 0.3.36 sdist with pip, builds it (scikit-build-core, cmake, g++, one
compile job) into a separate venv `.llama-cpp/venv` and installs sentencepiece, which the converter imports, into
`.llama-cpp/convert-deps`; the project's venv is not modified. Everything lives under `.llama-cpp/` (git-ignored);
later runs reuse the build (a rebuild reuses `.llama-cpp/build`). Time on 2 shared cores: the build from scratch
took 28 minutes (1656 s; the JSON records it), the rest about 2-3 minutes. Exit status 0 when every f32 comparison
is within tolerance and greedy tokens agree, 1 otherwise.
"""
import argparse, json, os, platform, re, subprocess, sys, tarfile, textwrap, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = '0.3.36'
WORK = ROOT/'.llama-cpp'
SDIST_TGZ = WORK/f'llama_cpp_python-{VERSION}.tar.gz'
SDIST = WORK/f'llama_cpp_python-{VERSION}'
LLAMA_DIR = SDIST/'vendor'/'llama.cpp'
VENV = WORK/'venv'
VENV_PY = VENV/'bin'/'python'
BUILD_DIR = WORK/'build'
BUILD_RECORD = WORK/'build_time.json'
DEPS = WORK/'convert-deps'
RUN = WORK/'run'
CMAKE_ARGS = ('-DLLAVA_BUILD=OFF -DGGML_OPENMP=OFF -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF '
              '-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF')
NEW_TOKENS = 16
# the pre-tokenizer regex of Qwen2's tokenizer.json; llama.cpp implements it as pre-tokenizer 'qwen2'
QWEN2_PRE_REGEX = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                   "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
ONE_CORE = dict(OMP_NUM_THREADS='1', MKL_NUM_THREADS='1', OPENBLAS_NUM_THREADS='1', CMAKE_BUILD_PARALLEL_LEVEL='1')


def log(*a): print(*a, flush=True)

def env(**extra):
    e = {**os.environ, **ONE_CORE, **extra}
    e.pop('PYTHONPATH', None)
    e.update({k: v for k, v in extra.items()})
    return e

def run(cmd, log_to=None, check=True, **kw):
    "Run a command; its output goes to `log_to` (a file) or is captured. Returns the CompletedProcess."
    if log_to is not None:
        with open(log_to, 'w') as f: r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, **kw)
        out = Path(log_to).read_text()
        r.stdout = out
    else: r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and r.returncode:
        tail = (r.stdout or '')[-3000:] + (r.stderr or '')[-3000:]
        raise RuntimeError(f'{" ".join(map(str, cmd))[:300]} failed ({r.returncode}):\n{tail}')
    return r

# ---------------------------------------------------------------------------------------------------------------------
# 1. llama.cpp: the vendored copy in the llama-cpp-python sdist, built with cmake into its own venv

def bindings_version():
    if not VENV_PY.exists(): return None
    r = run([str(VENV_PY), '-c', 'import llama_cpp; print(llama_cpp.__version__)'], check=False, env=env())
    return r.stdout.strip() if r.returncode == 0 else None

def ensure_llama_cpp() -> dict:
    WORK.mkdir(exist_ok=True)
    if not SDIST_TGZ.exists():
        log(f'downloading the llama-cpp-python {VERSION} sdist')
        run([sys.executable, '-m', 'pip', 'download', '--no-deps', '--no-binary', ':all:', f'llama-cpp-python=={VERSION}', '-d', str(WORK)],
            env=env())
    if not LLAMA_DIR.exists():
        with tarfile.open(SDIST_TGZ) as t: t.extractall(WORK, filter='data')
    built_now = 0.0
    if bindings_version() != VERSION:
        if not VENV_PY.exists(): run([getattr(sys, '_base_executable', sys.executable), '-m', 'venv', str(VENV)])
        fresh = not (BUILD_DIR/'CMakeCache.txt').exists()   # scikit-build-core keeps its cmake tree there: a rebuild is incremental
        log(f'building llama.cpp (llama-cpp-python {VERSION}) with one compile job ({"from scratch" if fresh else "incremental"}); '
            f'log: {WORK/"build.log"}')
        t0 = time.perf_counter()
        run(['nice', '-n', '10', str(VENV_PY), '-m', 'pip', 'install', '-v', '--no-cache-dir',
             f'--config-settings=build-dir={BUILD_DIR}', str(SDIST)], log_to=WORK/'build.log', env=env(CMAKE_ARGS=CMAKE_ARGS))
        secs = round(time.perf_counter() - t0, 1)
        rec = json.loads(BUILD_RECORD.read_text()) if BUILD_RECORD.exists() and not fresh else {}
        rec.update(dict(seconds=secs, cmake_args=CMAKE_ARGS, jobs=1, when=time.strftime('%Y-%m-%d %H:%M:%S'), fresh=True) if fresh else
                   dict(last_incremental_seconds=secs))
        BUILD_RECORD.write_text(json.dumps(rec, indent=1))
        built_now = secs
        if bindings_version() != VERSION: raise RuntimeError(f'the build finished but llama_cpp {VERSION} does not import from {VENV}')
    if not (DEPS/'sentencepiece').exists():   # the converter imports it before looking for tokenizer.model, even for BPE vocabularies
        run([sys.executable, '-m', 'pip', 'install', '--no-deps', '--target', str(DEPS), 'sentencepiece>=0.1.98,<0.3.0'], env=env())
    rec = json.loads(BUILD_RECORD.read_text()) if BUILD_RECORD.exists() else {}
    info = run([str(VENV_PY), '-c', 'import llama_cpp, sys; print(llama_cpp.llama_print_system_info().decode())'], env=env())
    return dict(llama_cpp_python=VERSION, built_now=bool(built_now), build_seconds_this_run=built_now, build_seconds=rec.get('seconds'), build_jobs=rec.get('jobs'),
                build_how='pip install of the sdist (scikit-build-core, cmake, g++), one compile job, nice 10, on 2 shared cores',
                last_incremental_build_seconds=rec.get('last_incremental_seconds'),
                cmake_args=rec.get('cmake_args'), built_at=rec.get('when'), system_info=info.stdout.strip()[:400],
                sdist_ggml_version=_ggml_version())

def _ggml_version():
    txt = (LLAMA_DIR/'ggml'/'CMakeLists.txt').read_text()
    parts = [re.search(rf'set\(GGML_VERSION_{k}\s+(\d+)\)', txt) for k in ('MAJOR', 'MINOR', 'PATCH')]
    return '.'.join(p.group(1) for p in parts) if all(parts) else None

# ---------------------------------------------------------------------------------------------------------------------
# 2. the exports

def set_dynamics(hybrid, seed=1):
    "GDN dynamics away from their defaults, as calibration leaves them: A_log, dt_bias, beta weights and the output gate."
    import torch
    from taylor_calibrate.convert import gdn_modules
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in gdn_modules(hybrid).values():
            m.A_log.copy_(torch.empty_like(m.A_log).uniform_(-3, 0, generator=g)); m.dt_bias.copy_(torch.randn(m.dt_bias.shape, generator=g))
            m.b_proj.weight.copy_(0.2 * torch.randn(m.b_proj.weight.shape, generator=g)); m.g_proj.weight.mul_(0.1)
            m.o_norm.weight.copy_(torch.empty_like(m.o_norm.weight).uniform_(0.5, 1.5, generator=g))
            if m.use_short_conv:
                for c in (m.q_conv1d, m.k_conv1d, m.v_conv1d): c.weight.copy_(0.5 * torch.randn(c.weight.shape, generator=g))
    return hybrid

def random_qwen3(vocab_size, seed=0):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab_size, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, max_position_embeddings=512, initializer_range=0.06,
                      tie_word_embeddings=False, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    m = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if 'norm' in n: p.uniform_(0.5, 1.5)
    return m

def make_exports() -> dict:
    import torch
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.convert import to_hybrid
    from taylor_calibrate.export import export_hybrid, export_blockers
    _, tok = load_teacher()
    out = {}
    specs = [('random-qwen3', lambda: random_qwen3(len(tok)), [0], dict(use_short_conv=True)),
             ('tiny-qwen3', lambda: load_teacher('tiny-qwen3')[0], [3, 7, 11], {})]
    for name, make, keep, opts in specs:
        teacher = make()
        hybrid = set_dynamics(to_hybrid(teacher, keep, **opts)).eval()
        if b := export_blockers(hybrid): raise RuntimeError(f'{name}: not exportable exactly: {b}')
        d = RUN/name/'hf'
        export_hybrid(hybrid, d, tokenizer=tok, overwrite=True)
        out[name] = dict(dir=d, hybrid=hybrid, keep=keep, options=opts, teacher=dict(
            layers=teacher.config.num_hidden_layers, hidden=teacher.config.hidden_size, heads=teacher.config.num_attention_heads,
            kv_heads=teacher.config.num_key_value_heads, head_dim=teacher.config.head_dim, vocab=teacher.config.vocab_size,
            tied=teacher.config.tie_word_embeddings, rms_norm_eps=teacher.config.rms_norm_eps))
    return out

# ---------------------------------------------------------------------------------------------------------------------
# 3. conversion with llama.cpp's converter

_PINNED = '''
import runpy, sys
conv_py, argv = sys.argv[1], sys.argv[2:]
sys.path[:0] = [str(__import__("pathlib").Path(conv_py).parent), str(__import__("pathlib").Path(conv_py).parent / "gguf-py")]
import conversion.base as base
for cls in vars(base).values():
    if isinstance(cls, type) and "get_vocab_base_pre" in vars(cls): cls.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv = [conv_py] + argv
runpy.run_path(conv_py, run_name="__main__")
'''

KNOWN_CONVERTER_FAILURES = {
    'assert self.opt_num_mtp_layers != 0':
        'Qwen3.5 conversion expects multi-token-prediction (MTP) layers (mtp_num_hidden_layers or mtp.* tensors); an export '
        'without them needs --no-mtp',
    'BPE pre-tokenizer was not recognized':
        "the converter names a BPE pre-tokenizer by hashing the ids of a fixed text, which no list can know for the shipped "
        "tokenizer (a small BPE trained for this project); its pre-tokenizer regex is Qwen2's, so 'qwen2' is pinned",
}

def _last_lines(text, n=3): return [l.rstrip() for l in text.splitlines() if l.strip()][-n:]

def convert(export_dir: Path, outtype='f32', start: int = 0) -> dict:
    """Convert with llama.cpp's convert_hf_to_gguf.py: first as it is, then with each workaround a known refusal calls for
    (--no-mtp; the pre-tokenizer pinned to 'qwen2' after checking the tokenizer's regex is Qwen2's). Returns what each try said."""
    gguf = export_dir.parent/f'model-{outtype}.gguf'
    conv_py = LLAMA_DIR/'convert_hf_to_gguf.py'
    args = [str(export_dir), '--outtype', outtype, '--outfile', str(gguf)]
    pre = json.loads((export_dir/'tokenizer.json').read_text())['pre_tokenizer']
    regexes = [p.get('pattern', {}).get('Regex') for p in pre.get('pretokenizers', [pre])]
    tries = [('stock', [sys.executable, str(conv_py), *args]),
             ('--no-mtp', [sys.executable, str(conv_py), *args, '--no-mtp']),
             ("--no-mtp, pre-tokenizer pinned to 'qwen2'", [sys.executable, '-c', _PINNED, str(conv_py), *args, '--no-mtp'])]
    res = dict(outtype=outtype, tries=[])
    for label, cmd in tries[start:]:
        if 'pinned' in label and QWEN2_PRE_REGEX not in regexes:
            raise RuntimeError(f"the export tokenizer's pre-tokenizer is not Qwen2's ({regexes}): pinning 'qwen2' would be wrong")
        gguf.unlink(missing_ok=True)
        t0 = time.perf_counter()
        r = run(cmd, check=False, env=env(PYTHONPATH=str(DEPS)))
        secs = round(time.perf_counter() - t0, 2)
        if r.returncode == 0:
            res['tries'].append(dict(how=label, ok=True, seconds=secs))
            res.update(how=label, convert_seconds=secs, gguf=str(gguf.relative_to(ROOT)), gguf_bytes=gguf.stat().st_size)
            return res
        known = [k for k in KNOWN_CONVERTER_FAILURES if k in r.stderr]
        res['tries'].append(dict(how=label, ok=False, seconds=secs, error=_last_lines(r.stderr),
                                 cause=KNOWN_CONVERTER_FAILURES[known[0]] if known else None))
        if not known: raise RuntimeError(f'convert_hf_to_gguf.py ({label}) failed on {export_dir}:\n{r.stderr[-4000:]}')
    raise RuntimeError(f'convert_hf_to_gguf.py failed every way on {export_dir}: {res["tries"]}')

def gguf_metadata(path: Path) -> dict:
    "Hyperparameters the converter wrote (read with its gguf-py)."
    code = textwrap.dedent('''
        import json, sys
        sys.path.insert(0, sys.argv[2])
        from gguf import GGUFReader
        r = GGUFReader(sys.argv[1])
        keep = ('general.architecture', 'qwen35.', 'tokenizer.ggml.pre', 'tokenizer.ggml.model')
        out = {}
        for k, f in r.fields.items():
            if not k.startswith(keep) or k.startswith('tokenizer.ggml.tokens'): continue
            v = f.contents()
            out[k] = v if not isinstance(v, list) or len(v) <= 64 else f'[{len(v)} values]'
        types = sorted({t.tensor_type.name for t in r.tensors})
        print(json.dumps(dict(fields=out, tensor_types=types, n_tensors=len(r.tensors), tensor_names=sorted({".".join(t.name.split(".")[2:]) or t.name for t in r.tensors}))))
    ''')
    r = run([sys.executable, '-c', code, str(path), str(LLAMA_DIR/'gguf-py')], env=env())
    return json.loads(r.stdout)

# ---------------------------------------------------------------------------------------------------------------------
# 4. logits: stock transformers (fresh interpreter, no taylor_calibrate) and llama.cpp (its own venv)

_TRANSFORMERS = '''
import json, sys
sys.modules['fla'] = None   # flash-linear-attention absent: transformers runs its PyTorch delta rule
import numpy as np, torch
torch.set_num_threads(1)
from transformers import AutoModelForCausalLM
a = json.loads(sys.argv[1])
seqs = [np.array(s) for s in a['seqs']]
def load(): return AutoModelForCausalLM.from_pretrained(a['dir'], dtype=torch.float32).eval()
m = load()
out = dict(cls=type(m).__name__, model_type=m.config.model_type)
with torch.no_grad():
    for i, s in enumerate(seqs):
        ids = torch.tensor(s)[None]
        out[f'logits{i}'] = m(ids).logits[0].numpy()
        out[f'gen{i}'] = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a['new_tokens'], do_sample=False,
                                    min_new_tokens=a['new_tokens'], eos_token_id=None, pad_token_id=0)[0, ids.shape[1]:].numpy()
    # negative controls: one piece of the mapping misread, everything else as in the export
    ctl = load()
    for n, p in ctl.named_parameters():   # zero-centred norms read as plain weights: w instead of 1 + w
        if n.endswith('norm.weight') and 'linear_attn.norm' not in n: p.sub_(1.0)
    out['control_norms0'] = ctl(torch.tensor(seqs[0])[None]).logits[0].numpy()
    ctl = load()
    for n, p in ctl.named_parameters():   # the attention output gate dropped (its constant 1/2 not applied)
        if n.endswith('self_attn.o_proj.weight'): p.mul_(2.0)
    out['control_gate0'] = ctl(torch.tensor(seqs[0])[None]).logits[0].numpy()
assert 'taylor_calibrate' not in sys.modules
np.savez(a['out'], **{k: v for k, v in out.items() if isinstance(v, np.ndarray)})
print(json.dumps({k: v for k, v in out.items() if not isinstance(v, np.ndarray)}))
'''

_LLAMA_CPP = '''
import json, sys
import numpy as np
import llama_cpp
from llama_cpp import Llama
a = json.loads(sys.argv[1])
seqs = [list(map(int, s)) for s in a['seqs']]
n_ctx = max(len(s) for s in seqs) + a['new_tokens'] + 8
F32 = 0   # GGML_TYPE_F32: keep the KV cache in f32 too (its default is f16)
llm = Llama(a['gguf'], n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=1, n_threads_batch=1, logits_all=True,
            type_k=F32, type_v=F32, verbose=False, seed=0)
out = {}
for i, s in enumerate(seqs):
    llm.reset(); llm.eval(s)
    out[f'prefill{i}'] = np.array(llm.scores[:len(s)])
    h = len(s) // 2
    llm.reset(); llm.eval(s[:h])
    for t in s[h:]: llm.eval([t])
    out[f'stepwise{i}'] = np.array(llm.scores[:len(s)])
    llm.reset(); llm.eval(s); gen = []
    for _ in range(a['new_tokens']):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1])); gen.append(t); llm.eval([t])
    out[f'gen{i}'] = np.array(gen)
text = "The quick brown fox jumps over the lazy dog. It's 3.14159, isn't it?\\n  def f(x): return x ** 2"
meta = dict(n_vocab=llm.n_vocab(), metadata={k: v for k, v in llm.metadata.items() if not k.startswith('tokenizer.chat')},
            tokens=llm.tokenize(text.encode(), add_bos=False, special=False), text=text,
            system_info=llama_cpp.llama_print_system_info().decode())
np.savez(a['out'], **out)
print(json.dumps(meta))
'''

def transformers_logits(export_dir, seqs, out):
    r = run([sys.executable, '-c', _TRANSFORMERS, json.dumps(dict(dir=str(export_dir), seqs=seqs, new_tokens=NEW_TOKENS, out=str(out)))],
            env=env())
    import numpy as np
    return json.loads(r.stdout.strip().splitlines()[-1]), dict(np.load(out))

def llama_cpp_logits(gguf, seqs, out):
    r = run([str(VENV_PY), '-c', _LLAMA_CPP, json.dumps(dict(gguf=str(gguf), seqs=seqs, new_tokens=NEW_TOKENS, out=str(out)))], env=env())
    import numpy as np
    return json.loads(r.stdout.strip().splitlines()[-1]), dict(np.load(out))

def log_softmax(x):
    import numpy as np
    x = x.astype(np.float64); m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))

def diffs(ref, got) -> dict:
    import numpy as np
    lp_r, lp_g = log_softmax(ref), log_softmax(got)
    top2 = np.sort(ref, -1)[:, -2:]
    agree = ref.argmax(-1) == got.argmax(-1)
    return dict(max_abs_logit_diff=float(np.abs(ref - got).max()), max_abs_logprob_diff=float(np.abs(lp_r - lp_g).max()),
                max_abs_logit=float(np.abs(ref).max()), logit_std=float(ref.std()),
                argmax_agree=f'{int(agree.sum())}/{len(agree)}',
                min_top2_margin_where_disagree=float((top2[:, 1] - top2[:, 0])[~agree].min()) if (~agree).any() else None)

# ---------------------------------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--out', default=str(ROOT/'bench'/'results'/'llama_cpp_check.json'))
    ap.add_argument('--seq-lens', default='48,64', help='lengths of the random token sequences (comma-separated)')
    ap.add_argument('--tol', type=float, default=1e-4, help='max |log-prob difference| allowed (f32 GGUF vs transformers fp32)')
    ap.add_argument('--info-outtypes', default='bf16', help='GGUF types also measured, for information only (comma-separated; empty: none)')
    args = ap.parse_args()
    if os.nice(0) < 10: os.nice(10 - os.nice(0))
    os.environ.update(ONE_CORE)
    import numpy as np, torch
    torch.set_num_threads(1)
    t_start = time.perf_counter()

    report = dict(check='llama.cpp runs export_hybrid exports (qwen3_5_text) like stock transformers', tolerance=dict(
        max_abs_logprob_diff=args.tol, why='f32 GGUF, f32 KV cache and fp32 transformers: only the order of floating-point operations '
        'and kernel details differ (measured: about 1e-5), while a misread piece of the mapping moves log-probs by more than 1 '
        '(see negative_controls)'))
    report['llama_cpp'] = ensure_llama_cpp()
    import transformers, taylor_calibrate
    report['versions'] = dict(python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__,
                              taylor_calibrate=taylor_calibrate.__version__, numpy=np.__version__,
                              llama_cpp_python=VERSION, ggml=report['llama_cpp']['sdist_ggml_version'])
    RUN.mkdir(parents=True, exist_ok=True)
    exports = make_exports()
    g = torch.Generator().manual_seed(7)
    failures, report['exports'] = [], {}
    for name, ex in exports.items():
        d, hybrid = ex['dir'], ex['hybrid']
        vocab = ex['teacher']['vocab']
        seqs = [torch.randint(0, vocab, (int(n),), generator=g).tolist() for n in args.seq_lens.split(',')]
        cfg = json.loads((d/'config.json').read_text())
        rec = dict(teacher=ex['teacher'], keep=ex['keep'], gdn_options=ex['options'], export=dict(
            model_type=cfg['model_type'], architectures=cfg['architectures'], layer_types=cfg['layer_types'],
            rope_parameters=cfg['rope_parameters'], linear_key_head_dim=cfg['linear_key_head_dim'],
            linear_value_head_dim=cfg['linear_value_head_dim'], linear_num_key_heads=cfg['linear_num_key_heads'],
            linear_num_value_heads=cfg['linear_num_value_heads'], rms_norm_eps=cfg['rms_norm_eps'],
            residual_scale=cfg['taylor_calibrate_export']['residual_scale']))
        log(f'[{name}] converting {d.relative_to(ROOT)} with convert_hf_to_gguf.py (f32)')
        conv = convert(d, 'f32')
        rec['convert'] = conv
        for t in conv['tries']:
            if not t['ok']: log(f"  convert_hf_to_gguf.py ({t['how']}) refused: {t['error'][-1]}: {t['cause']}")
        gguf = ROOT/conv['gguf']
        meta = gguf_metadata(gguf)
        rec['gguf'] = meta
        log(f'[{name}] transformers reference')
        t_info, ref = transformers_logits(d, seqs, d.parent/'transformers.npz')
        log(f'[{name}] llama.cpp')
        l_info, got = llama_cpp_logits(gguf, seqs, d.parent/'llama_cpp.npz')
        rec['transformers_class'] = t_info['cls']
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(d)
        rec['tokenizer'] = dict(same_ids_as_transformers=tok.encode(l_info['text'], add_special_tokens=False) == l_info['tokens'],
                                n_vocab=l_info['n_vocab'])
        with torch.no_grad(): hyb = [hybrid(torch.tensor(s)[None]).logits[0].numpy() for s in seqs]
        rows = []
        for i, s in enumerate(seqs):
            row = dict(seq_len=len(s), prefill=diffs(ref[f'logits{i}'], got[f'prefill{i}']),
                       stepwise=diffs(ref[f'logits{i}'], got[f'stepwise{i}']),
                       hybrid_vs_llama_cpp=diffs(hyb[i], got[f'prefill{i}']),
                       hybrid_vs_transformers=diffs(hyb[i], ref[f'logits{i}']),
                       greedy=dict(transformers=ref[f'gen{i}'].tolist(), llama_cpp=got[f'gen{i}'].tolist(),
                                   same=ref[f'gen{i}'].tolist() == got[f'gen{i}'].tolist()))
            for mode in ('prefill', 'stepwise'):
                m = row[mode]
                ok = m['max_abs_logprob_diff'] <= args.tol and m['argmax_agree'].split('/')[0] == m['argmax_agree'].split('/')[1]
                m['pass'] = ok
                if not ok: failures.append(f'{name} seq {i} {mode}: max |dlogprob| {m["max_abs_logprob_diff"]:.3g}, argmax {m["argmax_agree"]}')
            if not row['greedy']['same']: failures.append(f'{name} seq {i}: greedy tokens differ')
            rows.append(row)
        rec['sequences'] = rows
        rec['negative_controls'] = {
            'norms read as plain weights (w, not 1 + w)': diffs(ref['control_norms0'], got['prefill0'])['max_abs_logprob_diff'],
            'attention output gate dropped': diffs(ref['control_gate0'], got['prefill0'])['max_abs_logprob_diff']}
        for what, v in rec['negative_controls'].items():
            if v <= 10 * args.tol: failures.append(f'{name}: negative control "{what}" only moves log-probs by {v:.3g}: the check is blind to it')
        rec['info_outtypes'] = {}
        for ot in filter(None, args.info_outtypes.split(',')):   # rounding, not mapping: for information, no pass/fail
            log(f'[{name}] {ot} GGUF (for information)')
            c = convert(d, ot, start=2)
            _, g2 = llama_cpp_logits(ROOT/c['gguf'], seqs, d.parent/f'llama_cpp_{ot}.npz')
            rec['info_outtypes'][ot] = dict(note=f'{ot} GGUF against fp32 transformers: the rounding of the weights, not the mapping',
                                            convert_seconds=c['convert_seconds'], gguf_bytes=c['gguf_bytes'], sequences=[
                dict(seq_len=len(s), prefill=diffs(ref[f'logits{i}'], g2[f'prefill{i}']),
                     greedy_same=ref[f'gen{i}'].tolist() == g2[f'gen{i}'].tolist()) for i, s in enumerate(seqs)])
        report['exports'][name] = rec
    report['failures'] = failures
    report['pass'] = not failures
    report['seconds_total_excluding_build'] = round(time.perf_counter() - t_start - report['llama_cpp']['build_seconds_this_run'], 1)
    out = Path(args.out); out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + '\n')

    lc = report['llama_cpp']
    log(f"\nllama.cpp from llama-cpp-python {VERSION} (ggml {lc['sdist_ggml_version']}): build from scratch {lc['build_seconds']} s "
        f"({lc['build_jobs']} job); " + (f"this run built for {lc['build_seconds_this_run']} s" if lc['built_now'] else 'this run reused it'))
    for name, rec in report['exports'].items():
        c = rec['convert']
        log(f"[{name}] convert {c['convert_seconds']} s ({c['how']}), "
            f"tokenizer ids match: {rec['tokenizer']['same_ids_as_transformers']}")
        for r in rec['sequences']:
            p, s = r['prefill'], r['stepwise']
            log(f"  len {r['seq_len']}: prefill max|dlogit| {p['max_abs_logit_diff']:.2e} max|dlogprob| {p['max_abs_logprob_diff']:.2e} "
                f"argmax {p['argmax_agree']}; stepwise max|dlogprob| {s['max_abs_logprob_diff']:.2e} argmax {s['argmax_agree']}; "
                f"greedy same: {r['greedy']['same']}; max|logit| {p['max_abs_logit']:.1f}")
        log('  negative controls (max |dlogprob|): ' + ', '.join(f'{k}: {v:.2f}' for k, v in rec['negative_controls'].items()))
        for ot, r in rec['info_outtypes'].items():
            log(f'  {ot} GGUF (information): ' + '; '.join(f"len {q['seq_len']} max|dlogprob| {q['prefill']['max_abs_logprob_diff']:.2e} "
                                                       f"argmax {q['prefill']['argmax_agree']} greedy same {q['greedy_same']}" for q in r['sequences']))
    log(f"\n{'PASS' if report['pass'] else 'FAIL'} (tolerance max |dlogprob| <= {args.tol:g}); wrote {out}")
    for f in failures: log('  ' + f)
    return 0 if report['pass'] else 1

if __name__ == '__main__':
    sys.exit(main())
