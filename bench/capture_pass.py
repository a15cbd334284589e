"""Time of `calibrate`'s statistics stage (the teacher passes for statistics and captures): commit 130b9bf against this
checkout, on a random Qwen2 of Qwen2.5-0.5B's decoder shape.

Model: Qwen2 with hidden size 896, 24 layers, 14 query heads on 2 KV heads (head size 64), MLP 4864 and tied
embeddings, as Qwen2.5-0.5B, but a vocabulary of 8192; random weights (seed 0), float32, CPU, one thread.
Run: `calibrate(model, ids, init='taylor+')` with the default keep (`uniform:0.25`: 18 converted layers) on random
token ids, `calib_tokens=1024`, `heldout_tokens=512` (windows of 512) and `steps=1`, with `core.CAPTURE_FLOOR` and
`core.CAPTURE_BUDGET` set so that each capture group holds one layer: the grouping `calibrate`'s defaults give
Qwen2.5-0.5B at the taylor+ budget (16,384 calibration tokens), at a budget small enough for a run of minutes.
Reported: `calibration_report.timings['statistics_s']` of each run, medians per code and new/old.

Each run is a fresh subprocess whose PYTHONPATH selects the code: `old` is commit 130b9bf's `taylor_calibrate`
(`git archive`, unpacked into a temporary folder), `new` this checkout; the order is old, new, new, old. Each run
also hashes the calibrated hybrid's state dict (sha256 over every key and tensor's bytes, in order): equal hashes
mean the two codes calibrate this model to the same bits.
Run: `python bench/capture_pass.py` (writes bench/results/capture_pass.json).
"""
import hashlib, io, json, os, platform, statistics, subprocess, sys, tarfile, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT/'bench'/'results'/'capture_pass.json'
OLD_COMMIT = '130b9bf'
SHAPE = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
             vocab_size=8192, tie_word_embeddings=True, max_position_embeddings=4096)
BUDGET = dict(calib_tokens=1024, heldout_tokens=512, steps=1)
ORDER = ['old', 'new', 'new', 'old']

def run_once():
    "One calibration in this process; prints its timings, capture groups and state-dict hash as JSON."
    import torch
    torch.set_num_threads(1)
    import taylor_calibrate, taylor_calibrate.core as core
    from transformers import Qwen2Config, Qwen2ForCausalLM
    core.CAPTURE_FLOOR, core.CAPTURE_BUDGET = 1, 0.          # one layer per capture group
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE)).eval()
    tokens = BUDGET['calib_tokens'] + BUDGET['heldout_tokens']
    ids = torch.randint(0, SHAPE['vocab_size'], (tokens,), generator=torch.Generator().manual_seed(1))
    hybrid = core.calibrate(model, ids, init='taylor+', progress=False, **BUDGET)
    rep = hybrid.calibration_report
    digest = hashlib.sha256()
    for k, v in hybrid.state_dict().items():
        digest.update(k.encode()); digest.update(v.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    print(json.dumps(dict(package=taylor_calibrate.__file__, converted=rep.converted,
                          capture_groups=len(core.capture_groups(model, rep.converted, tokens)),
                          timings={k: round(v, 2) for k, v in rep.timings.items()}, state_sha256=digest.hexdigest())))

def git(*args): return subprocess.run(['git', '-C', str(ROOT), *args], check=True, capture_output=True).stdout

def main():
    with tempfile.TemporaryDirectory() as tmp:
        tarfile.open(fileobj=io.BytesIO(git('archive', OLD_COMMIT, 'taylor_calibrate'))).extractall(tmp, filter='data')
        paths = dict(old=tmp, new=str(ROOT))
        runs = []
        for code in ORDER:
            env = {**os.environ, 'PYTHONPATH': paths[code], 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}
            t0 = time.time()
            p = subprocess.run([sys.executable, __file__, '--run'], env=env, cwd=ROOT, capture_output=True, text=True)
            if p.returncode: raise RuntimeError(f'{code} run failed:\n{p.stderr[-3000:]}')
            r = json.loads(p.stdout.strip().splitlines()[-1])
            assert r['package'].startswith(paths[code]), (code, r['package'])
            r.update(code=code, wall_s=round(time.time() - t0, 1), loadavg_1min=os.getloadavg()[0])
            runs.append(r)
            print(code, r['timings']['statistics_s'], 's statistics,', r['wall_s'], 's in all', flush=True)
    med = {c: statistics.median(r['timings']['statistics_s'] for r in runs if r['code'] == c) for c in ('old', 'new')}
    out = dict(meta=dict(what="calibrate's statistics_s (teacher passes for statistics and captures), old vs new code",
                         old=f'commit {OLD_COMMIT}', new=git('describe', '--always', '--dirty').decode().strip(),
                         model=dict(family='qwen2', dtype='float32', weights='random, seed 0', **SHAPE),
                         calibrate=dict(init='taylor+', keep='uniform:0.25', seq_len=512, **BUDGET),
                         capture_groups='one layer per group (core.CAPTURE_FLOOR=1, core.CAPTURE_BUDGET=0), as the defaults '
                                        'give Qwen2.5-0.5B at the taylor+ budget; the token budgets are cut so a run takes minutes',
                         order=ORDER, threads=1, machine=f'{platform.machine()}, {os.cpu_count()} CPUs (shared)',
                         python=platform.python_version()),
               runs=runs, median_statistics_s=med, new_over_old=round(med['new'] / med['old'], 4),
               same_state_dict=len({r['state_sha256'] for r in runs}) == 1)
    RESULTS.write_text(json.dumps(out, indent=1) + '\n')
    print(json.dumps({k: out[k] for k in ('median_statistics_s', 'new_over_old', 'same_state_dict')}))

if __name__ == '__main__':
    run_once() if '--run' in sys.argv else main()
