"""calibrate's statistics stage at Qwen2.5-0.5B's shape with the taylor+ recipe: the code of a base commit and this
checkout, run side by side.

Each run is `bench/full_size.py --one Qwen2.5-0.5B --init taylor+ --threads 1` (random weights, float32, the recipe's
16,384 calibration and 2,048 held-out tokens, 4 Phase-2 steps a layer) in a fresh process whose PYTHONPATH selects the
code: `base` is the base commit's repository (`git archive`, unpacked into a temporary folder: its package and its
full_size.py), `new` this checkout. The base run and the new runs start together, one core each, so both see the same
machine at the same time; the new code runs again after each of its runs until the base run ends (the base takes
tens of minutes, the new a few). Every process runs with `MALLOC_MMAP_THRESHOLD_=131072`, as full_size.py's committed
runs do.
Reported: each run's `timings` (`statistics_s` is the stage: the teacher passes for statistics and captures), its
`calibrate` memory row, and the ratio of the medians new/base.
Run: `python bench/statistics_side_by_side.py` (writes bench/results/statistics_side_by_side.json; about 35 minutes).
"""
import argparse, io, json, os, statistics, subprocess, sys, tarfile, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT/'bench'/'results'/'statistics_side_by_side.json'
BASE_COMMIT = '130b9bf'   # per-group teacher passes from the embeddings (the code bench/results/full_size.json measured)
ARGS = ['--one', 'Qwen2.5-0.5B', '--init', 'taylor+', '--threads', '1', '--steps', '4']

def start(tree: Path, log: Path):
    "A full_size.py measurement with the package of `tree`, writing its output to `log`."
    env = dict(os.environ, PYTHONPATH=str(tree), MALLOC_MMAP_THRESHOLD_='131072', OMP_NUM_THREADS='1')
    return subprocess.Popen([sys.executable, str(tree/'bench'/'full_size.py'), *ARGS], env=env, cwd=tree,
                            stdout=log.open('w'), stderr=subprocess.STDOUT)

def result(log: Path) -> dict:
    lines = [l for l in log.read_text().splitlines() if l.startswith('RESULT ')]
    if not lines: raise SystemExit(f'no result in {log}:\n{log.read_text()[-3000:]}')
    r = json.loads(lines[-1][7:])
    return dict(timings=r['timings'], calibrate=r['stages']['calibrate'], weight_mb=r['weight_mb'], budget=r['budget'])

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--out', default=str(RESULTS))
    a = p.parse_args()
    work = Path(tempfile.mkdtemp())
    base = work/'base'; base.mkdir()
    tar = subprocess.run(['git', '-C', str(ROOT), 'archive', BASE_COMMIT], check=True, capture_output=True).stdout
    tarfile.open(fileobj=io.BytesIO(tar)).extractall(base)
    t0 = time.time()
    base_proc, base_log = start(base, work/'base.log'), work/'base.log'
    runs = dict(base=[], new=[])
    while True:
        log = work/f'new{len(runs["new"])}.log'
        proc = start(ROOT, log)
        proc.wait()
        if proc.returncode: raise SystemExit(f'new run failed:\n{log.read_text()[-3000:]}')
        runs['new'].append(dict(result(log), started_s=round(time.time() - t0), base_running=base_proc.poll() is None))
        print('new', runs['new'][-1]['timings'], flush=True)
        if base_proc.poll() is not None: break
    if base_proc.wait(): raise SystemExit(f'base run failed:\n{base_log.read_text()[-3000:]}')
    runs['base'].append(result(base_log))
    print('base', runs['base'][-1]['timings'], flush=True)
    concurrent = [r for r in runs['new'] if r['base_running']]   # the new runs that shared the machine with the base run
    med = lambda rs: statistics.median(r['timings']['statistics_s'] for r in rs)
    out = dict(meta=dict(base_commit=BASE_COMMIT, args=ARGS, malloc='131072', cpu_count=os.cpu_count(), loadavg=os.getloadavg(),
                         note='base and new started together, one thread each; new repeated while base ran'),
               runs=runs, statistics_s_median=dict(base=med(runs['base']), new=med(concurrent)),
               ratio_new_over_base=round(med(concurrent) / med(runs['base']), 4))
    Path(a.out).write_text(json.dumps(out, indent=1))
    print('new/base statistics_s:', out['ratio_new_over_base'])

if __name__ == '__main__':
    main()
