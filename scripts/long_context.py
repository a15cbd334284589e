"""Long-context probes on a teacher and its hybrids: passkey, multi-key needle and associative recall
(`taylor_calibrate.probes`), the teacher always measured beside the students.

    python scripts/long_context.py --teacher smollm2-135m                      # the teacher alone
    python scripts/long_context.py --teacher smollm2-135m \\
        --students runs/students_smollm2-135m --ledger bench/results/experiments_smollm2-135m/runs.jsonl

Students are folders written by `scripts/experiments.py --save-students DIR` (one per zero-shot run, named by the
run's key); each is labelled from the experiments ledger (init, layer policy, seed). `--hybrids` adds folders written by
`taylor-calibrate convert`, labelled from their calibration reports. Every answered prompt is one
JSON line of `<out-dir>/runs.jsonl`; a prompt already answered by a model is never asked again, so an interrupted run
resumes. The summary (accuracy with 95% Wilson intervals per model, kind and size: the context length asked for, or
the number of word pairs) goes to `<out-dir>/long_context.json`.
"""
import argparse, hashlib, json, os, re, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]

def probe_items(tok, a):
    from taylor_calibrate.probes import probe_items
    return probe_items(tok, context_lens=[int(c) for c in a.contexts.split(',')], depths=[float(d) for d in a.depths.split(',')],
                       n=a.n, seed=a.seed, keys=a.keys, pairs=[int(p) for p in a.pairs.split(',')])

def item_key(it): return hashlib.sha1(it.prompt.encode()).hexdigest()[:16]

def student_labels(students, ledger):
    "Student folder -> label (init, policy, seed, the authors' KV row copy where used, and the distillation tokens of a recovered student) from the experiments ledger; folders without a ledger row are skipped."
    import sys; sys.path.insert(0, str(ROOT/'scripts'))
    from experiments import claim_name
    rows = [json.loads(l) for l in Path(ledger).read_text().splitlines() if l.strip()]
    by_name = {claim_name(r['key']): r for r in rows}
    out = {}
    for d in sorted(Path(students).iterdir()):
        if d.name in by_name:
            r = by_name[d.name]; j = r['job']
            out[d] = f"{j['init']} | {j['keep']} | seed {j['seed']}" + (' | row copy' if j.get('kv_copy') == 'rows_bug' else '')
            if j['kind'] == 'recovery': out[d] += f" | recovered ({r['log']['eval_tokens'][-1]:,} tokens)"
    return out

def hybrid_labels(folders: str) -> dict:
    """Folder -> label ('taylor+ | needle:0.5 | seed 0') for hybrids saved by `convert` or `save_hybrid`, from the calibration
    report beside the weights; an entry 'LABEL=DIR' names its own label (a distilled hybrid, say)."""
    from taylor_calibrate.hybrid import read_calibration_report
    out = {}
    for entry in folders.split(','):
        if '=' in entry: label, d = entry.rsplit('=', 1); out[Path(d)] = label; continue
        d = Path(entry)
        rep = read_calibration_report(d)
        if rep is None: raise FileNotFoundError(f'{d} holds no calibration report: not a hybrid saved by convert or save_hybrid')
        policy = rep.selection['policy'] if rep.selection else ','.join(map(str, rep.keep))
        out[d] = f'{rep.init} | {policy} | seed {rep.seed}'
    return out

def main(a):
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.probes import run_probes, accuracy
    torch.set_num_threads(a.threads)
    out = Path(a.out_dir or ROOT/'bench'/'results'/f'long_context_{a.teacher}'); out.mkdir(parents=True, exist_ok=True)
    teacher, tok = load_teacher(a.teacher, progress=False)
    items = sorted(probe_items(tok, a), key=lambda it: it.context_len)
    models = {'teacher': None}
    if a.students: models.update({label: d for d, label in student_labels(a.students, a.ledger).items() if re.search(a.only, label)})
    if a.hybrids: models.update({label: d for d, label in hybrid_labels(a.hybrids).items()})
    path = out/'runs.jsonl'
    done = {(r['model'], r['item']) for r in map(json.loads, path.read_text().splitlines())} if path.exists() else set()
    for label, folder in models.items():
        todo = [it for it in items if (label, item_key(it)) not in done]
        if not todo: continue
        if folder is None: model = teacher
        else:
            from taylor_calibrate.convert import load_hybrid
            model = load_hybrid(folder).eval()
        for it in todo:
            t0 = time.time()
            row = run_probes(model, tok, [it], a.max_new_tokens, progress=False)[0]
            with open(path, 'a') as f:
                f.write(json.dumps(dict(model=label, item=item_key(it), seconds=time.time() - t0, **row)) + '\n'); f.flush(); os.fsync(f.fileno())
            print(f"{label:40} {it.kind:9} {it.context_len:6} depth {it.depth:.2f} {'ok ' if row['correct'] else 'MISS'} "
                  f"{row['answer']!r} <- {row['continuation']!r} ({time.time() - t0:.0f}s)", flush=True)
    rows = {}                                                           # one row per model and prompt: the first answer (greedy
    for r in map(json.loads, path.read_text().splitlines()): rows.setdefault((r['model'], r['item']), r)   # decoding repeats it)
    by_model = {}                                                       # every model the ledger holds
    for r in rows.values(): by_model.setdefault(r['model'], []).append(r)
    summary = {m: accuracy(rs, by=('kind', 'size')).to_dict(orient='records') for m, rs in by_model.items()}
    answers = {m: [{k: r[k] for k in ('kind', 'size', 'context_len', 'depth', 'answer', 'continuation', 'correct')} for r in rs]
               for m, rs in by_model.items()}
    setup = dict(teacher=a.teacher, depths=a.depths, n=a.n, keys=a.keys, seed=a.seed, max_new_tokens=a.max_new_tokens, torch=torch.__version__)
    (out/'long_context.json').write_text(json.dumps(dict(setup=setup, accuracy=summary, answers=answers,
                                                         prompts=[dict(kind=it.kind, context_len=it.context_len, depth=it.depth, answer=it.answer,
                                                                       prompt=it.prompt if it.context_len <= 300 else it.prompt[:300] + ' ... ' + it.prompt[-300:])
                                                                  for it in items[:3]]), indent=1))
    print('wrote', out/'long_context.json')

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--teacher', default='smollm2-135m', help='a teacher name load_teacher takes')
    p.add_argument('--students', default=None, help='a folder of saved hybrids from experiments.py --save-students')
    p.add_argument('--hybrids', default=None, help='comma list of hybrid folders written by taylor-calibrate convert, labelled from their reports; '
                   "an entry LABEL=DIR names its own label")
    p.add_argument('--ledger', default=None, help="the experiments ledger that names the students' runs")
    p.add_argument('--only', default='', help="a regular expression the students' labels ('taylor | uniform:0.25 | seed 0') must match")
    p.add_argument('--contexts', default='1024,2048,4096,8192', help='prompt lengths in tokens (passkey, multi-key)')
    p.add_argument('--depths', default='0.1,0.3,0.5,0.7,0.9')
    p.add_argument('--pairs', default='8,16', help='word pairs per associative-recall prompt')
    p.add_argument('--keys', type=int, default=4, help='numbers hidden in each multi-key prompt')
    p.add_argument('--n', type=int, default=1, help='prompts per (kind, length, depth)')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--max-new-tokens', type=int, default=8)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--out-dir', default=None, help='default: bench/results/long_context_<teacher>/')
    a = p.parse_args()
    if a.students and not a.ledger: p.error('--students needs --ledger (the experiments ledger that names each run)')
    main(a)
