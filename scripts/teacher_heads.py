"""Every head's attention statistics on a teacher, for the explainer's figures of a real model's heads.

    python scripts/teacher_heads.py --teacher smollm2-135m     # -> bench/results/heads_smollm2-135m.json

Mean attention distance, entropy and distance histogram of every query head of every layer (`attention_stats`), over
`--windows` windows of `--seq-len` TRAIN tokens: the split and window length calibration reads. The file holds
`AttentionStats.to_json()`, each head's mean attention on the first token of the window, the teacher's loss on each 512-token window of the first `--test-tokens` TEST tokens, and the setup.
"""
import argparse, json, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]

def first_token_mass(teacher, ids):
    "Each head's mean attention on the window's first token, over queries t >= 1: [layers][heads] (eager attention, one window at a time)."
    from taylor_calibrate.teacher import attention_maps
    total = 0
    for w in ids:
        maps = attention_maps(teacher, w[None])             # [L, 1, H, T, T]
        total = total + maps[:, 0, :, 1:, 0].mean(-1)
    return (total / len(ids)).tolist()

@torch.no_grad()
def window_nll(teacher, ids, seq_len=512):
    "Mean next-token negative log-likelihood of each non-overlapping `seq_len` window of `ids` (as `perplexity` scores them)."
    import torch.nn.functional as F
    out = []
    for w in ids.split(seq_len):
        if w.numel() < 2: continue
        logits = teacher(input_ids=w[None]).logits.float()
        out.append(F.cross_entropy(logits[0, :-1], w[1:]).item())
    return out

def main(a):
    from taylor_calibrate.teacher import load_teacher, corpus_token_ids
    from taylor_calibrate.stats import attention_stats
    torch.set_num_threads(a.threads)
    teacher, tok = load_teacher(a.teacher, progress=False)
    ids = corpus_token_ids(tok, 'train', a.windows * a.seq_len).view(a.windows, a.seq_len)
    t0 = time.time()
    st = attention_stats(teacher, ids, progress=False)
    out = dict(teacher=a.teacher, split='train', windows=a.windows, seq_len=a.seq_len, seconds=time.time() - t0,
               torch=torch.__version__, stats=json.loads(st.to_json()), first_token_mass=first_token_mass(teacher, ids[:a.sink_windows]),
               sink_windows=a.sink_windows, test_tokens=a.test_tokens,
               test_window_nll=window_nll(teacher, corpus_token_ids(tok, 'test', a.test_tokens)))
    path = Path(a.out or ROOT/'bench'/'results'/f'heads_{a.teacher}.json')
    path.write_text(json.dumps(out)); print('wrote', path, f'({out["seconds"]:.0f}s)')

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--teacher', default='smollm2-135m', help='a teacher name load_teacher takes')
    p.add_argument('--windows', type=int, default=16)
    p.add_argument('--seq-len', type=int, default=512)
    p.add_argument('--sink-windows', type=int, default=2, help='windows the first-token mass is measured on (full attention matrices)')
    p.add_argument('--test-tokens', type=int, default=8192, help="TEST tokens whose per-window loss is recorded (the real teacher's evaluation length)")
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--out', default=None, help='default: bench/results/heads_<teacher>.json')
    main(p.parse_args())
