"""Run `granitemoehybrid` exports (Mamba2 hybrids) in llama.cpp: each blocker reproduced, then the logits with both worked around.

What it checks. `export_hybrid(h, path, layout='granitemoehybrid')` writes a Mamba2 hybrid of a Llama, Qwen2 or
Mistral teacher as transformers' `GraniteMoeHybridForCausalLM`, whose Mamba2 layers have the teacher's hidden size
(`mamba_expand` 1) and whose kept attention layers use the teacher's RoPE. llama.cpp has the architecture
(`granitehybrid`), but two things of it were written for IBM's Granite 4.0-H and do not hold for these exports; this
script shows each, on llama.cpp's own converter and runtime (the copy vendored in the llama-cpp-python 0.3.36 sdist,
built by `bench/llama_cpp_check.py`), in the order a user meets them:

1. **Mamba2 width.** The runtime asserts `2 * n_embd == d_inner` when it loads the model (`src/models/granite-hybrid.cpp`,
   "only an expansion factor of 2 is supported for now"). The stock export converts, then the process aborts on load;
   the script records the assertion from the process's stderr.
2. **RoPE switched off.** The converter writes `rope.scaling.finetuned = false` for every GraniteMoeHybrid model with
   Mamba2 layers (Granite 4.0-H has no position embedding), and the runtime reads that flag as "no RoPE"
   (`conversion/granite.py`, `set_gguf_parameters`). With the width worked around, the model runs but its logits are
   not the export's: the script measures how far.

The workarounds, applied here to copies of the exports and never in the package:

* the width: every Mamba2 layer padded with as many zero heads (and B/C groups) as it has, so that `d_inner` is twice
  the hidden size. A zero head has x = B = C = 0, so its state stays 0, its output and skip are 0, the gated norm of
  its group is 0 and its out_proj columns are 0: the padded model computes the same function (checked in transformers
  in float64, where the two agree to the last bit, before llama.cpp sees it). It costs twice the Mamba2 width in
  memory and compute.
* RoPE: the converter run with `rope.scaling.finetuned = true` (and the trained context length) written after its own
  parameters.

Each padded export is then compared, at every position of random token sequences, with stock transformers on the
same folder in float64: in one batch (prefill), half in one batch then one token at a time (the recurrent state
carried over), and 16 greedy tokens. Tolerance (f32 GGUF, f32 KV cache): max |log-prob difference| <= max(2 x
transformers' own float32 gap from float64, 1e-4), the rule of `bench/serve_check.py --mixer mamba2` (transformers'
reference Mamba2 scan is itself about 1e-4 off in float32); every argmax equal, the same greedy tokens. Exports: a random Llama (attention kept in layer 0) and a random Qwen2 with q/k/v biases
(layer 3 kept), both made by `bench/serve_check.py`'s `make_granite_export` over the shipped tokenizer's vocabulary.

How to run (from the repository root, with the project's venv; it builds llama.cpp first if `bench/llama_cpp_check.py`
has not, about 28 minutes on one core):

    .venv/bin/python bench/llama_cpp_granite.py      # -> bench/results/llama_cpp_granite.json

Exit status 0 when both blockers reproduce as described and the worked-around exports agree within the tolerance.
"""
import argparse, json, os, platform, shutil, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/'bench'))
from llama_cpp_check import (DEPS, LLAMA_DIR, NEW_TOKENS, ONE_CORE, QWEN2_PRE_REGEX, RUN, VENV_PY, VERSION, _LLAMA_CPP, diffs,
                             ensure_llama_cpp, env, log, run)

EXPORTS = {'llama': [0], 'qwen2': [3]}   # teacher kind -> kept attention layers (serve_check's GRANITE_EXPORTS)
WIDTH_ASSERT = 'GGML_ASSERT(2 * n_embd == d_inner)'

# llama.cpp's converter, run in-process with two optional changes: the pre-tokenizer pinned to 'qwen2' (the shipped
# tokenizer's regex is Qwen2's; the converter names pre-tokenizers by a hash it cannot know for it) and RoPE kept on
_CONVERT = '''
import runpy, sys, pathlib
conv_py, keep_rope, argv = sys.argv[1], sys.argv[2] == "rope", sys.argv[3:]
here = pathlib.Path(conv_py).parent
sys.path[:0] = [str(here), str(here / "gguf-py")]
import conversion.base as base, conversion.granite as granite
for cls in vars(base).values():
    if isinstance(cls, type) and "get_vocab_base_pre" in vars(cls): cls.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
if keep_rope:
    own = granite.GraniteHybridModel.set_gguf_parameters
    def set_gguf_parameters(self):
        own(self)
        self.gguf_writer.add_rope_scaling_finetuned(True)
        self.gguf_writer.add_context_length(self.hparams["max_position_embeddings"])
    granite.GraniteHybridModel.set_gguf_parameters = set_gguf_parameters
sys.argv = [conv_py] + argv
runpy.run_path(conv_py, run_name="__main__")
'''

_TRANSFORMERS = '''
import json, sys
import numpy as np, torch
torch.set_num_threads(1)
from transformers import AutoModelForCausalLM
a = json.loads(sys.argv[1])
out = {}
with torch.no_grad():
    for name, d in a['dirs'].items():
        for dtype in (torch.float64, torch.float32):
            m = AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval()
            tag = f"{name}_{str(dtype).split('.')[-1]}"
            for i, s in enumerate(a['seqs']):
                ids = torch.tensor(s)[None]
                out[f'{tag}_logits{i}'] = m(ids).logits[0].double().numpy()
                out[f'{tag}_gen{i}'] = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=a['new_tokens'], do_sample=False,
                                                  min_new_tokens=a['new_tokens'], eos_token_id=None, pad_token_id=0)[0, ids.shape[1]:].numpy()
assert 'taylor_calibrate' not in sys.modules
np.savez(a['out'], **out)
'''


def pad_mamba_heads(src: Path, dst: Path) -> dict:
    """Copy export `src` to `dst` with every Mamba2 layer given as many zero heads and B/C groups as it has (twice the width)."""
    import torch
    from safetensors.torch import load_file, save_file
    shutil.rmtree(dst, ignore_errors=True); shutil.copytree(src, dst)
    cfg = json.loads((src/'config.json').read_text())
    H, G, N, P, E = cfg['mamba_n_heads'], cfg['mamba_n_groups'], cfg['mamba_d_state'], cfg['mamba_d_head'], cfg['hidden_size']
    I = H * P
    if cfg['mamba_expand'] * E != I: raise ValueError(f'{src}: mamba_expand x hidden_size != heads x head size')
    sd = load_file(src/'model.safetensors')
    def interleave(t, sizes, fill=0.0):
        "Each consecutive block of `t` (dim 0) followed by an equal block of `fill`."
        parts = torch.split(t, sizes)
        return torch.cat([x for p in parts for x in (p, torch.full_like(p, fill))])
    for k in list(sd):
        if '.mamba.' not in k: continue
        t = sd[k]
        if k.endswith('in_proj.weight'): sd[k] = interleave(t, [I, I, G * N, G * N, H])      # z, x, B, C, dt rows
        elif k.endswith(('conv1d.weight', 'conv1d.bias')): sd[k] = interleave(t, [I, G * N, G * N])   # x, B, C channels
        elif k.endswith(('dt_bias', 'A_log', 'D')): sd[k] = interleave(t, [H])
        elif k.endswith('norm.weight'): sd[k] = interleave(t, [I], fill=1.0)
        elif k.endswith('out_proj.weight'): sd[k] = torch.cat([t, torch.zeros_like(t)], 1)           # [hidden, I] -> [hidden, 2I]
        else: raise ValueError(f'{k}: a Mamba2 tensor this padding does not know')
    save_file({k: v.contiguous() for k, v in sd.items()}, dst/'model.safetensors', metadata={'format': 'pt'})
    cfg.update(mamba_n_heads=2 * H, mamba_n_groups=2 * G, mamba_expand=2 * cfg['mamba_expand'])
    (dst/'config.json').write_text(json.dumps(cfg, indent=2))
    return dict(heads=f'{H} -> {2 * H}', groups=f'{G} -> {2 * G}', d_inner=f'{I} -> {2 * I}', hidden_size=E)


def convert(export_dir: Path, gguf: Path, keep_rope: bool) -> dict:
    gguf.unlink(missing_ok=True)
    t0 = time.perf_counter()
    r = run([sys.executable, '-c', _CONVERT, str(LLAMA_DIR/'convert_hf_to_gguf.py'), 'rope' if keep_rope else 'stock', str(export_dir),
             '--outtype', 'f32', '--outfile', str(gguf)], check=False, env=env(PYTHONPATH=str(DEPS)))
    res = dict(ok=r.returncode == 0, seconds=round(time.perf_counter() - t0, 2), rope_kept=keep_rope)
    if r.returncode: raise RuntimeError(f'convert_hf_to_gguf.py failed on {export_dir}:\n{r.stderr[-4000:]}')
    return res


def llama_cpp(gguf: Path, seqs, out: Path) -> tuple[int, dict | None, str]:
    "Run llama.cpp's CPU runtime on `gguf`: its exit status, its arrays (None if it died) and the end of its stderr."
    r = run([str(VENV_PY), '-c', _LLAMA_CPP, json.dumps(dict(gguf=str(gguf), seqs=seqs, new_tokens=NEW_TOKENS, out=str(out)))],
            check=False, env=env())
    import numpy as np
    return r.returncode, (dict(np.load(out)) if r.returncode == 0 else None), (r.stderr or '')[-2000:]


_LOAD = 'import sys; from llama_cpp import Llama; Llama(sys.argv[1], n_ctx=256, n_threads=1, verbose=True); print("loaded")'

def load_only(gguf: Path) -> tuple[int, str]:
    "Load `gguf` in llama.cpp with its log on (the bindings hide stderr while loading otherwise): exit status and stderr."
    r = run([str(VENV_PY), '-c', _LOAD, str(gguf)], check=False, env=env())
    return r.returncode, (r.stderr or '') + (r.stdout or '')


def compare(ref: dict, got: dict, prefix: str, n_seqs: int, vocab: int) -> dict:
    import numpy as np
    res = {}
    for i in range(n_seqs):
        r = ref[f'{prefix}_logits{i}']
        res[f'seq{i}'] = dict(prefill=diffs(r, got[f'prefill{i}'][:, :vocab]), stepwise=diffs(r, got[f'stepwise{i}'][:, :vocab]),
                              same_greedy_tokens=bool(np.array_equal(ref[f'{prefix}_gen{i}'], got[f'gen{i}'])))
    worst = max(max(v['prefill']['max_abs_logprob_diff'], v['stepwise']['max_abs_logprob_diff']) for v in res.values())
    return dict(per_sequence=res, max_abs_logprob_diff=worst,
                all_argmax_agree=all(v[k]['argmax_agree'].split('/')[0] == v[k]['argmax_agree'].split('/')[1]
                                     for v in res.values() for k in ('prefill', 'stepwise')),
                same_greedy_tokens=all(v['same_greedy_tokens'] for v in res.values()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--out', default=str(ROOT/'bench'/'results'/'llama_cpp_granite.json'))
    ap.add_argument('--seq-lens', default='48,80', help='lengths of the random token sequences (80 crosses a 64-token chunk)')
    ap.add_argument('--tol-floor', type=float, default=1e-4, help="the tolerance's floor: max |log-prob difference| against transformers "
                    "float64 may be max(2 x transformers' own float32 gap, this)")
    a = ap.parse_args()
    os.environ.update(ONE_CORE)
    import numpy as np, torch, transformers
    torch.set_num_threads(1)
    from serve_check import make_granite_export
    t_start = time.perf_counter()
    report = dict(check="llama.cpp on export_hybrid(layout='granitemoehybrid') exports: the two blockers reproduced, then the "
                        'exports with both worked around compared with stock transformers', tolerance_floor=a.tol_floor,
                  llama_cpp=ensure_llama_cpp(),
                  versions=dict(python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__,
                                llama_cpp_python=VERSION), exports={})
    g = torch.Generator().manual_seed(7)
    ok = True
    for name, keep in EXPORTS.items():
        work = RUN/f'granite_{name}'                     # this script's own scratch folder, made afresh
        shutil.rmtree(work, ignore_errors=True); work.mkdir(parents=True)
        stock, padded = work/'hf', work/'hf_padded'
        log(f'[{name}] export (attention kept in {keep})')
        make_granite_export(name, keep, stock)
        padding = pad_mamba_heads(stock, padded)
        vocab = json.loads((stock/'config.json').read_text())['vocab_size']
        seqs = [torch.randint(0, vocab, (int(n),), generator=g).tolist() for n in a.seq_lens.split(',')]
        log(f'[{name}] transformers on the export and on its padded copy')
        run([sys.executable, '-c', _TRANSFORMERS, json.dumps(dict(dirs=dict(stock=str(stock), padded=str(padded)), seqs=seqs,
                                                                  new_tokens=NEW_TOKENS, out=str(work/'transformers.npz')))], env=env())
        ref = dict(np.load(work/'transformers.npz'))
        n = range(len(seqs))
        pad_exact = dict(max_abs_logit_diff_float64=max(float(np.abs(ref[f'stock_float64_logits{i}'] - ref[f'padded_float64_logits{i}']).max()) for i in n),
                         same_greedy_tokens=all(np.array_equal(ref[f'stock_float64_gen{i}'], ref[f'padded_float64_gen{i}']) for i in n))
        fp32_gap = compare(ref, {f'prefill{i}': ref[f'padded_float32_logits{i}'] for i in n} | {f'stepwise{i}': ref[f'padded_float32_logits{i}'] for i in n}
                           | {f'gen{i}': ref[f'padded_float32_gen{i}'] for i in n}, 'padded_float64', len(seqs), vocab)['max_abs_logprob_diff']
        tol = max(2 * fp32_gap, a.tol_floor)
        rec = dict(keep=keep, seq_lens=[len(s) for s in seqs], padding=dict(padding, transformers_padded_vs_stock=pad_exact),
                   transformers_float32_gap=fp32_gap, tolerance=tol)

        log(f'[{name}] 1. the stock export: convert, then run')
        rec['stock'] = dict(convert=convert(stock, work/'stock-f32.gguf', keep_rope=False))
        rc, err = load_only(work/'stock-f32.gguf')
        rec['stock'].update(exit_status=rc, width_assert=WIDTH_ASSERT in err,
                            assertion=[l.replace(str(LLAMA_DIR) + '/', '') for l in err.splitlines() if 'GGML_ASSERT' in l][:1])
        log(f'  exit status {rc}; width assertion {"reproduced" if WIDTH_ASSERT in err else "NOT seen"}')

        log(f'[{name}] 2. padded, RoPE as the converter writes it (off)')
        rec['padded_rope_off'] = dict(convert=convert(padded, work/'padded-norope-f32.gguf', keep_rope=False))
        rc, got, err = llama_cpp(work/'padded-norope-f32.gguf', seqs, work/'padded_norope.npz')
        rec['padded_rope_off'].update(exit_status=rc, **(compare(ref, got, 'padded_float64', len(seqs), vocab) if got else dict(stderr_tail=err[-500:])))

        log(f'[{name}] 3. padded, RoPE kept')
        rec['padded_rope_on'] = dict(convert=convert(padded, work/'padded-f32.gguf', keep_rope=True))
        rc, got, err = llama_cpp(work/'padded-f32.gguf', seqs, work/'padded.npz')
        rec['padded_rope_on'].update(exit_status=rc, **(compare(ref, got, 'padded_float64', len(seqs), vocab) if got else dict(stderr_tail=err[-500:])))
        on, off = rec['padded_rope_on'], rec['padded_rope_off']
        rec['pass'] = bool(rec['stock']['width_assert'] and rec['stock']['exit_status'] != 0 and pad_exact['max_abs_logit_diff_float64'] < 1e-9
                           and pad_exact['same_greedy_tokens'] and off.get('max_abs_logprob_diff', 0) > 100 * tol
                           and on.get('max_abs_logprob_diff', float('inf')) <= tol and on['all_argmax_agree'] and on['same_greedy_tokens'])
        log(f"[{name}] padded vs stock in transformers float64 {pad_exact['max_abs_logit_diff_float64']:.1e}; tolerance {tol:.1e}; llama.cpp RoPE off "
            f"{off.get('max_abs_logprob_diff', float('nan')):.2e}, RoPE on {on.get('max_abs_logprob_diff', float('nan')):.2e} -> "
            f"{'pass' if rec['pass'] else 'FAIL'}")
        report['exports'][name] = rec
        ok &= rec['pass']
    report.update(pass_=ok, seconds_total=round(time.perf_counter() - t_start, 1))
    report['pass'] = report.pop('pass_')
    Path(a.out).write_text(json.dumps(report, indent=1, default=float))
    log('wrote', a.out)
    sys.exit(0 if ok else 1)


if __name__ == '__main__':
    main()
