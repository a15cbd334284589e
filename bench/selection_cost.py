"""What choosing the layers costs: the AR and retrieval policies side by side on one teacher, teacher passes counted.

    python bench/selection_cost.py --teacher smollm2-135m      # -> bench/results/selection_cost_smollm2-135m.json

Both policies score every layer of the teacher on the same VALID tokens (`--tokens`, windows of 512) through
`select_layers`, which is what `calibrate` calls. A forward hook on the teacher's input embeddings counts the
windows that enter the teacher; divided by the number of windows it gives the passes over the data each policy makes
(AR: one perplexity pass of the teacher and one per layer with that layer's attention zeroed; retrieval: one
statistics pass). Wall time is measured `--repeats` times, the two policies alternating, on `--threads` threads;
medians and their ratio. GA-S2 is not timed here: each of its per-layer probes is a conversion and a short
calibration, whose time the experiments ledger records (`timings.select_s`).
"""
import argparse, json, statistics, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--teacher', default='smollm2-135m')
    p.add_argument('--tokens', type=int, default=4096, help='VALID tokens both policies read')
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--out', type=Path, default=None)
    a = p.parse_args(argv)
    from taylor_calibrate.teacher import load_teacher, corpus_token_ids
    from taylor_calibrate.policies import select_layers
    torch.set_num_threads(a.threads)
    teacher, tok = load_teacher(a.teacher, progress=False)
    ids = corpus_token_ids(tok, 'valid', a.tokens)
    windows = ids.numel() // 512
    seen = []
    hook = teacher.get_input_embeddings().register_forward_hook(lambda mod, args, out: seen.append(out.shape[0]))
    runs = {pol: dict(seconds=[], passes=None, kept=None) for pol in ('ar:0.25', 'retrieval:0.25')}
    try:
        for r in range(a.repeats):
            for pol in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                seen.clear(); t0 = time.perf_counter()
                kept, _ = select_layers(teacher, pol, data=ids, seq_len=512, progress=False)
                runs[pol]['seconds'].append(time.perf_counter() - t0)
                runs[pol]['passes'], runs[pol]['kept'] = sum(seen) / windows, kept
    finally: hook.remove()
    for r in runs.values(): r['median_s'] = statistics.median(r['seconds'])
    out = dict(teacher=a.teacher, tokens=ids.numel(), windows=windows, threads=a.threads, repeats=a.repeats, policies=runs,
               ar_over_retrieval=runs['ar:0.25']['median_s'] / runs['retrieval:0.25']['median_s'], torch=torch.__version__,
               loadavg_1min=__import__('os').getloadavg()[0])
    path = a.out or ROOT/'bench'/'results'/f'selection_cost_{a.teacher}.json'
    path.write_text(json.dumps(out, indent=1))
    for pol, r in runs.items(): print(f"{pol}: {r['passes']:.0f} passes over the data, median {r['median_s']:.1f} s, keeps {r['kept']}")
    print(f"AR / retrieval: {out['ar_over_retrieval']:.1f}x; wrote {path}")


if __name__ == '__main__':
    main()
