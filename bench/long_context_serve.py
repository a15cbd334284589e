"""SmolLM2-135M and its hybrids served at long context by vLLM's CPU build, through the package's plugin.

What it measures
----------------
The registry teacher (stock vLLM, its converted safetensors folder) and two of its zero-shot hybrids, each a folder
`scripts/experiments.py --save-students DIR` wrote (uniform policy, init `taylor`, seed 0): 25% of the layers kept as
attention (8 of 30; the serving case) and 75% kept (the hybrid that answers the passkey, `scripts/long_context.py`).

1. **Probes through the server.** Passkey prompts (`taylor_calibrate.probes`, seed 0) at `--contexts` tokens and five
   depths, asked of each model twice: through vLLM's OpenAI server (bfloat16, greedy, 8 new tokens) and through the
   package's own `greedy_continuation` (float32, the package's environment). Reported per model: exact-match accuracy
   of each, with 95% Wilson intervals, and agreement (the same first word; the same decoded continuation).
2. **Throughput.** The teacher and the 25% hybrid served at once on one core, requests alternating between them (the
   order swapped every repeat): a `--lengths` token prompt from the VALID split and 128 greedy tokens, streamed.
   Prefill: prompt tokens / seconds to the first token; decode: tokens / seconds from the first to the last. Medians
   of `--repeats` and hybrid / teacher ratios, measured side by side in one run.
3. **Memory.** What each model's generation cache holds at 2K and 8K tokens (`taylor_calibrate.cache.cache_bytes`,
   bfloat16 KV as vLLM stores it, float32 GDN state), the longest context that fits in 1 GiB of cache by that count,
   and the token capacity vLLM itself reports for the 1 GiB of KV cache space the servers are given
   (`VLLM_CPU_KVCACHE_SPACE`, its "KV cache size: N tokens" log line).

How to run (repository root, the project's environment; the vLLM environment of bench/serve_check.py is made on first
use, and the package installed into it as bench/vllm_plugin_check.py does):

    .venv/bin/python bench/long_context_serve.py        # -> bench/results/long_context_serve_smollm2-135m.json

Needs the two saved hybrids (`scripts/experiments.py --teacher smollm2-135m --eval-tokens 8192 --save-students
runs/students_smollm2-135m`, parts grid and retention) or `--hybrid-25 DIR --hybrid-75 DIR`. Two CPU cores, one
used by the servers: about 25 minutes.

`--hybrids NAME=DIR,...` probes other hybrids beside the teacher (part 1 and the cache sizes of part 3, no throughput),
e.g. the `needle` policy's hybrids of `taylor-calibrate convert`:

    .venv/bin/python bench/long_context_serve.py --hybrids needle_25=DIR25/model,needle_50=DIR50/model \
        --out bench/results/long_context_serve_needle_smollm2-135m.json
"""
import argparse, contextlib, json, re, statistics, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/'bench')); sys.path.insert(0, str(ROOT/'scripts'))
from serve_check import ensure_vllm_venv  # noqa: E402
from vllm_plugin_check import ensure_plugin, plugin_server, _timed_stream, _greedy_request, _versions, wait_for_other_servers  # noqa: E402

TEACHER = 'smollm2-135m'
NEW_TOKENS = 8          # probe continuations, as scripts/long_context.py asks them
STREAM_NEW = 128        # throughput: greedy tokens after each prompt
CACHE_GIB = 1           # the KV cache space the servers get (VLLM_CPU_KVCACHE_SPACE, set by vllm_plugin_check._env)


def student_dir(keep: str, init: str = 'taylor', seed: int = 0) -> Path:
    "The folder scripts/experiments.py --save-students runs/students_smollm2-135m writes for one zero-shot run."
    from experiments import claim_name, job_key, zero_shot_job
    return ROOT/'runs'/f'students_{TEACHER}'/claim_name(job_key(zero_shot_job(keep, init, seed)))


def package_answers(folder: Path | None, items, threads: int) -> list[str]:
    "The package's own greedy continuations (float32): the registry teacher when `folder` is None, else a saved hybrid."
    import torch
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.hybrid import load_hybrid
    from taylor_calibrate.probes import greedy_continuation
    torch.set_num_threads(threads)
    teacher, tok = load_teacher(TEACHER, progress=False)
    model = teacher if folder is None else load_hybrid(folder)
    model.eval()
    return [greedy_continuation(model, tok, it.prompt, NEW_TOKENS) for it in items]


def served_answers(base: str, tok, items) -> list[str]:
    "vLLM's greedy continuations of the same prompts (token ids, no special tokens added), decoded as the package decodes."
    out = []
    for it in items:
        ids = tok(it.prompt, add_special_tokens=False)['input_ids']
        (new, _), = _greedy_request(base, [ids], NEW_TOKENS, timeout=900)[0]
        out.append(tok.decode(new, skip_special_tokens=True))
    return out


def kv_capacity(log: Path) -> int | None:
    "The token capacity vLLM logs for its KV cache space ('... KV cache size: N tokens')."
    m = re.findall(r'KV cache size: ([\d,]+) tokens', log.read_text())
    return int(m[-1].replace(',', '')) if m else None


def memory(folders: dict, lengths, cache_gib: float) -> dict:
    "Cache bytes at each length (bf16 KV, float32 GDN state) and the longest context within `cache_gib` GiB, per model."
    import torch
    from transformers import AutoConfig
    from taylor_calibrate.cache import cache_bytes
    import taylor_calibrate.hybrid  # noqa: F401  (registers the hybrid config types)
    budget = int(cache_gib * 2**30)
    out = {}
    for name, folder in folders.items():
        cfg = AutoConfig.from_pretrained(folder)
        at = lambda n: cache_bytes(cfg, n, dtype=torch.bfloat16)
        lo, hi = 0, 1 << 24                       # the longest n with at(n)['total'] <= budget (bisection; bytes grow with n)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if at(mid)['total'] <= budget else (lo, mid - 1)
        out[name] = dict(bytes={str(n): at(n) for n in lengths}, longest_context_in_budget=lo)
    return dict(cache_gib=cache_gib, models=out)


def side_by_side_throughput(py, folders: dict, tok, lengths, repeats: int, core: int, work: Path, max_len: int):
    """The teacher and the 25% hybrid served at once, requests alternating: median prefill and decode rates per prompt
    length, hybrid / teacher ratios, and the KV capacity each server reports."""
    from taylor_calibrate.teacher import corpus_token_ids
    valid = corpus_token_ids(tok, 'valid', max_tokens=max(lengths)).tolist()
    pair = dict(teacher=folders['teacher'], hybrid_25=folders['hybrid_25'])
    times = {m: {n: dict(prefill=[], decode=[]) for n in lengths} for m in pair}
    wait_for_other_servers()
    with contextlib.ExitStack() as stack:
        bases = {m: stack.enter_context(plugin_server(py, Path(d), work/f'vllm_throughput_{m}.log', core, exclusive=False,
                                                      max_len=max_len)) for m, d in pair.items()}
        capacity = {m: kv_capacity(work/f'vllm_throughput_{m}.log') for m in pair}
        for m in bases: _timed_stream(bases[m], valid[:64], 4)          # warm-up
        for r in range(repeats):
            for n in lengths:
                for m in (list(bases) if r % 2 == 0 else list(bases)[::-1]):
                    t_prefill, t_decode = _timed_stream(bases[m], valid[:n], 1 + STREAM_NEW)
                    times[m][n]['prefill'].append(n / t_prefill); times[m][n]['decode'].append(STREAM_NEW / t_decode)
            print(f'throughput repeat {r + 1}/{repeats} done', flush=True)
    med = lambda xs: statistics.median(xs)
    throughput = {str(n): dict(models={m: dict(prefill_tokens_per_s=med(times[m][n]['prefill']), decode_tokens_per_s=med(times[m][n]['decode']),
                                               prefill_runs=times[m][n]['prefill'], decode_runs=times[m][n]['decode']) for m in pair},
                               hybrid_over_teacher={k: med(times['hybrid_25'][n][k]) / med(times['teacher'][n][k]) for k in ('prefill', 'decode')})
                  for n in lengths}
    return throughput, capacity

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--hybrid-25', type=Path, default=None, help='the 25%%-kept hybrid (default: the saved uniform:0.25 taylor seed-0 student)')
    p.add_argument('--hybrid-75', type=Path, default=None, help='the 75%%-kept hybrid (default: the saved uniform:0.75 taylor seed-0 student)')
    p.add_argument('--hybrids', default=None, help='NAME=DIR,... : probe these hybrids beside the teacher instead, and measure no throughput '
                   '(e.g. the needle:0.25 and needle:0.5 hybrids of taylor-calibrate convert, their model/ folders)')
    p.add_argument('--contexts', default='1024,2048,4096', help='passkey context lengths (tokens)')
    p.add_argument('--lengths', default='2048,8000', help='throughput prompt lengths (tokens; at most 8192 - 129)')
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--core', type=int, default=0, help='the CPU core the servers are bound to')
    p.add_argument('--threads', type=int, default=1, help="threads of the package's own forward passes")
    p.add_argument('--out', type=Path, default=ROOT/'bench'/'results'/f'long_context_serve_{TEACHER}.json')
    a = p.parse_args(argv)
    from taylor_calibrate.teacher import load_teacher, registry_teacher_dir
    from taylor_calibrate.probes import passkey_items, first_word, wilson_interval
    t_start = time.time()
    folders = dict(teacher=registry_teacher_dir(TEACHER, progress=False))
    if a.hybrids: folders.update(dict(kv.split('=', 1) for kv in a.hybrids.split(',')))
    else: folders.update(hybrid_25=a.hybrid_25 or student_dir('uniform:0.25'), hybrid_75=a.hybrid_75 or student_dir('uniform:0.75'))
    missing = [f'{n}: {f}' for n, f in folders.items() if not (Path(f)/'config.json').exists()]
    if missing: raise SystemExit('missing model folders (run scripts/experiments.py --save-students first, or pass them): ' + '; '.join(missing))
    contexts, lengths = [int(c) for c in a.contexts.split(',')], [int(n) for n in a.lengths.split(',')]
    max_len = 8192
    if max(lengths) + STREAM_NEW + 1 > max_len or max(contexts) + NEW_TOKENS + 16 > max_len:
        raise SystemExit(f'prompts must leave room for the new tokens within {max_len} tokens')
    py = ensure_vllm_venv(ROOT/'.vllm-venv')
    plugin = ensure_plugin(py)
    _, tok = load_teacher(TEACHER, progress=False)
    work = Path(tempfile.mkdtemp(prefix='lc_serve_'))

    # 1. probes: the package, then the server, per model
    items = passkey_items(tok, context_lens=contexts, n=1, seed=0)
    probes = {}
    for name, folder in folders.items():
        t0 = time.time()
        pkg = package_answers(None if name == 'teacher' else Path(folder), items, a.threads)
        t_pkg = time.time() - t0
        wait_for_other_servers()
        with plugin_server(py, Path(folder), work/f'vllm_probes_{name}.log', a.core, max_len=max_len) as base:
            t0 = time.time(); served = served_answers(base, tok, items); t_srv = time.time() - t0
        rows = [dict(context_len=it.context_len, depth=it.depth, answer=it.answer, package=pk, served=sv,
                     package_correct=first_word(pk) == it.answer, served_correct=first_word(sv) == it.answer)
                for it, pk, sv in zip(items, pkg, served)]
        k_pkg, k_srv, n = sum(r['package_correct'] for r in rows), sum(r['served_correct'] for r in rows), len(rows)
        probes[name] = dict(rows=rows, n=n, package_correct=k_pkg, served_correct=k_srv,
                            package_interval=wilson_interval(k_pkg, n), served_interval=wilson_interval(k_srv, n),
                            same_first_word=sum(first_word(r['package']) == first_word(r['served']) for r in rows),
                            same_continuation=sum(r['package'] == r['served'] for r in rows), package_s=t_pkg, served_s=t_srv)
        print(f"{name}: package {k_pkg}/{n}, served {k_srv}/{n}, same first word {probes[name]['same_first_word']}/{n}", flush=True)

    out = dict(teacher=TEACHER, models={n: str(f) for n, f in folders.items()}, contexts=contexts, new_tokens=NEW_TOKENS, probes=probes)
    if a.hybrids: out.update(memory=memory(folders, [2048, 8192], CACHE_GIB))     # other hybrids: probes and cache sizes only
    else:                                                                          # 2. throughput
        throughput, capacity = side_by_side_throughput(py, folders, tok, lengths, a.repeats, a.core, work, max_len)
        out.update(throughput=dict(lengths=lengths, new_tokens=STREAM_NEW, repeats=a.repeats, max_model_len=max_len, by_length=throughput),
                   memory=dict(**memory(folders, [2048, 8192], CACHE_GIB), vllm_kv_cache_tokens=capacity))
    out.update(versions=_versions(py), plugin=plugin, seconds=time.time() - t_start)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1, default=float))
    print('wrote', a.out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
