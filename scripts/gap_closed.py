"""Put the paper's "88x" in proportion: the share of the log-perplexity gap each initialisation closes.

    .venv/bin/python scripts/gap_closed.py      # -> bench/results/gap_closed.json and nbs/images/gap_closed.svg

naive/taylor cannot exceed naive/teacher, and naive/teacher differs by orders of magnitude between settings
(about 4,400 on the paper's 88x row, about 2.5 on this package's shipped teachers). So per row we report

    closed(init) = (ln ppl_naive - ln ppl_init) / (ln ppl_naive - ln ppl_teacher)    (0 = naive copy, 1 = teacher)

and split naive/taylor = (naive/zero_gate) x (zero_gate/taylor): the "regime" effect of silencing the converted layers,
times what the calibrated converted layers carry beyond silence.

Inputs (nothing is measured here):
- the paper's rows: `PAPER` below, typed from the project's research notes on the reference implementation (reference-implementation.md: the authors' released
  result files, as extracted there); every number carries the line it comes from, and when that file is present the
  script checks that each number is on its cited line.
- this package's rows: bench/results/experiments/experiments.json (teacher tiny-qwen2),
  bench/results/experiments_tiny-qwen3/experiments.json, and the gauge sweeps bench/results/gauge/gauge.json and
  bench/results/gauge_tiny-qwen3/gauge.json (the same teachers with W_V / k, k W_O: the same function);
- a real pretrained teacher's rows: bench/results/experiments_smollm2-135m/experiments.json (SmolLM2-135M), every cell
  of its grid that has a naive copy and another init, with the seeds its ledger holds.

Package rows aggregate seeds: perplexities are medians over seeds, derived numbers are computed from those medians, and
each derived number also gets the min and max over every combination of the seeds of its inputs.

`taylor+` and the `gauge_fix` switch: the experiments ledgers record no recipe fields, so the recipe of their `taylor+`
runs is read off the gauge sweeps, whose ledgers do record `gauge_fix`: a grid run whose perplexity equals a gauge
sweep run of the same cell and seed to a relative 1e-6 (the two recipes differ by about 0.3 %) ran that run's recipe.
`taylor+` below is the package's recipe (gauge_fix on); `taylor+ (gauge_fix off)` the same recipe without the switch.
"""
import html, json, math, re, statistics
from itertools import product
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT/'bench'/'results'
REFERENCE = ROOT.parent/'shared'/'research'/'reference-implementation.md'   # outside the repository; checked only if present
OUT_JSON, OUT_SVG = RESULTS/'gap_closed.json', ROOT/'nbs'/'images'/'gap_closed.svg'
MATCH = 1e-6          # relative: a grid run and a gauge-sweep run of the same recipe agree to ~1e-8; the two taylor+ recipes differ by ~3e-3
INITS = ('naive', 'zero_gate', 'phase1', 'phase2', 'taylor', 'taylor+', 'taylor+ (gauge_fix off)')

# ----- the paper's numbers -----
# Perplexities: WikiText-2 test, seq 2048 (reference-implementation.md section 7, line 309). Init names there:
# baseline = naive copy, zero-gate, taylor-init / Taylor-Init (Phase 1) = phase1, Alignment-Only (Phase 2) = phase2,
# taylor-distill / Taylor-Distill (Phase 1+2) = taylor. `lines` maps each number to its line in reference-implementation.md.
_ZS = ('naive', 'zero_gate', 'phase1', 'taylor')          # the column order of the section 9.4 tuples below
def _sweep(model, kept, teacher, teacher_line, first_line, rows, headline):
    "Three policy rows of a section 9.4 table (uniform, ar, ga-s2), each (baseline, zero-gate, taylor-init, taylor-distill) at 5-line steps."
    out = []
    for n, (policy, ppls) in enumerate(zip(('uniform', 'ar', 'ga-s2'), rows)):
        base = first_line + 5*n                           # rows: _baseline, _zero-gate, _small-gate, _taylor-init, _taylor-distill
        lines = dict(teacher=teacher_line, naive=base, zero_gate=base + 1, phase1=base + 3, taylor=base + 4)
        out.append(dict(model=model, policy=policy, kept=kept, headline=headline, ppl=dict(teacher=teacher, **dict(zip(_ZS, ppls))), lines=lines))
    return out

PAPER = [   # headline=True: the 88x row and the settings quoted with it (Qwen3-8B at 25 % kept, Llama-3.2-3B at 50 % kept)
    # Section 9.1 "Representative ablation: source of the 88x claim" (results/eval/ablation/summary.csv), table lines 335-339;
    # policy and kept fraction not recorded (line 331). Teacher: "Teacher baseline WikiText-2 PPLs logged during AR probing:
    # ... Qwen2.5-3B 8.556" (section 5.3, line 291); section 6 (line 300) rounds it to 8.56.
    dict(model='Qwen2.5-3B', policy='ablation (88x row)', kept=None, headline=True,
         ppl=dict(teacher=8.556, naive=37337.34, zero_gate=22469.04, phase1=22470.56, phase2=2015.91, taylor=424.13),
         lines=dict(teacher=291, naive=335, zero_gate=336, phase1=337, phase2=338, taylor=339)),
    # Section 9.4, "Qwen3-8B, 25 % attention kept (9/36)", lines 485-499; teacher row "| teacher | 9.73 |" line 500.
    *_sweep('Qwen3-8B', 0.25, 9.73, 500, 485, [(43608.66, 1106.03, 1105.02, 166.2), (3014.66, 482.67, 483.04, 131.93),
                                               (571089.62, 16896.57, 16970.42, 204.75)], True),
    # Section 9.4, "Llama-3.2-3B-Instruct, 50 % kept (14/28)", lines 546-560; teacher "PPL 11.05" in its heading, line 542.
    *_sweep('Llama-3.2-3B', 0.5, 11.05, 542, 546, [(8842.83, 595.1, 599.11, 70.36), (2033.49, 111.14, 111.23, 33.02),
                                                   (2181.05, 322.4, 322.23, 57.65)], True),
    # Section 9.4, "Qwen3-8B, 50 % kept (18/36)", lines 506-520; same teacher, line 500.
    *_sweep('Qwen3-8B', 0.5, 9.73, 500, 506, [(361.06, 53.47, 53.46, 32.91), (223.43, 129.2, 129.44, 52.01),
                                              (1045.96, 1042.53, 1044.58, 69.56)], False),
    # Section 9.4, "Qwen3-8B, 75 % kept (27/36)", lines 526-540; same teacher, line 500.
    *_sweep('Qwen3-8B', 0.75, 9.73, 500, 526, [(19.24, 11.85, 11.85, 11.42), (24.19, 15.9, 15.92, 13.85),
                                               (20.55, 27.18, 27.16, 23.1)], False),
    # Section 9.4, "Llama-3.2-3B-Instruct, 75 % kept (21/28)", lines 566-580; teacher 11.05 from the 50 % heading, line 542.
    *_sweep('Llama-3.2-3B', 0.75, 11.05, 542, 566, [(3080.52, 25.36, 25.36, 21.89), (46.3, 14.8, 14.8, 13.68),
                                                    (41.56, 158.44, 158.35, 14.55)], False),
    # Section 9.4, 'Qwen2.5-3B-Instruct, archive "zeroshot_3b_75pct"', lines 603-617; "teacher 8.56" in its heading, line 599.
    *_sweep('Qwen2.5-3B', 0.75, 8.56, 599, 603, [(19.69, 12.90, 12.90, 11.99), (28.85, 13.16, 13.16, 12.46),
                                                 (13728.33, 10587.68, 10572.14, 12.90)], False),
]
# Other teacher perplexities in the same file, reported as a sensitivity check only: Qwen3-8B "CSV 9.6" (line 417; the
# summary CSV's teacher row, line 473); Qwen2.5-3B 8.56 (line 300) for the ablation row.
TEACHER_ALTERNATIVES = {('Qwen3-8B', 9.6): 473, ('Qwen2.5-3B', 8.56): 300}

def check_paper_numbers(path=REFERENCE):
    "Assert every typed paper number appears on its cited line of reference-implementation.md (skipped if the file is absent)."
    if not path.exists(): return f'{path.name} not found: citations not re-checked'
    lines = path.read_text().splitlines()
    nums = lambda i: {float(x) for x in re.findall(r'\d+(?:\.\d+)?', lines[i - 1])}
    for row in PAPER:
        for init, line in row['lines'].items():
            assert row['ppl'][init] in nums(line), f"{row['model']} {row['policy']} {init}={row['ppl'][init]} not on line {line}"
    for (model, ppl), line in TEACHER_ALTERNATIVES.items(): assert ppl in nums(line), f'{model} teacher {ppl} not on line {line}'
    return f'every paper number found on its cited line of {path.name}'

# ----- this package's numbers -----
def load_json(rel):
    "A committed JSON file under bench/results/."
    return json.loads((RESULTS/rel).read_text())

def teacher_of(setup):
    "The teacher's name in an experiments setup (the default teacher's carries none: tiny-qwen2)."
    return setup.get('teacher') or 'tiny-qwen2'

def gauge_cells(g):
    "{(keep, init name, k): [ppl per seed]} from a gauge.json, with 'taylor+ (gauge_fix)' renamed 'taylor+' and plain 'taylor+' 'taylor+ (gauge_fix off)'."
    rename = {'taylor+ (gauge_fix)': 'taylor+', 'taylor+': 'taylor+ (gauge_fix off)'}
    return {(keep, rename.get(name, name), float(k)): dict(zip(c['seeds'], c['values']))
            for keep, names in g['runs'].items() for name, ks in names.items() for k, c in ks.items()}

def gauge_fix_invariant(cells):
    "True if every gauge-fixed taylor+ cell gives the same perplexity (to MATCH) at every k, seed by seed (so a k = 10 run stands for k = 1)."
    by_keep_seed = {}
    for (keep, name, k), v in cells.items():
        if name == 'taylor+':
            for seed, ppl in v.items(): by_keep_seed.setdefault((keep, seed), []).append(ppl)
    return all(max(v) / min(v) - 1 < MATCH for v in by_keep_seed.values())

def taylor_plus_recipe(exp, cells):
    "Which gauge_fix the experiments grid's taylor+ runs used: the gauge-sweep recipe whose run (same keep and seed) has the same perplexity."
    found = set()
    for keep, cell in [(key.split('|')[0], c) for key, c in {**exp['grid'], **exp['retention']}.items() if key.endswith('|taylor+')]:
        for seed, ppl in zip(cell['seeds'], cell['values']):
            for (k_keep, name, k), v in cells.items():
                if k_keep == keep and name.startswith('taylor+') and seed in v and abs(v[seed] / ppl - 1) < MATCH and (name == 'taylor+' or k == 1.0):
                    found.add((name, f'{keep} seed {seed} = k={k:g}'))
    names = {n for n, _ in found}
    assert len(names) == 1, f'grid taylor+ runs match {names or "no"} gauge-sweep recipe'
    return names.pop(), sorted(e for _, e in found)

def package_rows(exp_rel, gauge_rel):
    "Rows for one shipped teacher: the grid (three policies, 25 % kept) and retention sweep, then the gauge sweep at k != 1."
    exp, g = load_json(exp_rel), load_json(gauge_rel)
    teacher, t_ppl = teacher_of(exp['setup']), exp['teacher_test_ppl']
    assert abs(g['teacher_test_ppl'] - t_ppl) < 1e-9 and g['setup']['eval_tokens'] == exp['setup']['eval_tokens'], 'gauge and grid evaluate differently'
    cells = gauge_cells(g)
    recipe, evidence = taylor_plus_recipe(exp, cells)
    invariant = gauge_fix_invariant(cells)
    grid = {}
    for key, c in {**exp['grid'], **exp['retention']}.items():
        keep, init = key.split('|')
        grid.setdefault(keep, {})[recipe if init == 'taylor+' else init] = dict(zip(c['seeds'], c['values']))
    rows = []
    for keep, ppl in grid.items():
        notes = [f"{exp_rel} taylor+ runs have {'gauge_fix on' if recipe == 'taylor+' else 'gauge_fix off'}: their perplexities equal gauge-sweep runs that record the switch ({'; '.join(evidence)})"]
        for (g_keep, name, k), v in sorted(cells.items(), key=lambda t: (t[0][2] != 1.0, t[0][2])):   # the other taylor+ recipe, k = 1 first
            if g_keep == keep and name.startswith('taylor+') and name not in ppl and (k == 1.0 or (name == 'taylor+' and invariant)):
                ppl[name] = v
                notes.append(f"{name} from {gauge_rel} at k={k:g}, seeds {sorted(v)}" + ('' if k == 1.0 else
                             ' (gauge-fixed taylor+ gives the same perplexity at every k of that sweep, to 1e-6)'))
        policy, kept = keep.split(':')
        rows.append(dict(source='package', model=teacher, policy=policy, kept=float(kept), k=1.0, headline=False,
                         ppl=dict(teacher=t_ppl, **ppl), files=[f'bench/results/{exp_rel}', f'bench/results/{gauge_rel}'], note='; '.join(notes)))
    for keep, k in sorted({(keep, k) for keep, _, k in cells if k != 1.0}, key=lambda t: (t[0], t[1])):
        ppl = {name: v for (kk, name, kv), v in cells.items() if kk == keep and kv == k}
        policy, kept = keep.split(':')
        rows.append(dict(source='package', model=teacher, policy=policy, kept=float(kept), k=k, headline=False,
                         ppl=dict(teacher=t_ppl, **ppl), files=[f'bench/results/{gauge_rel}'],
                         note=f'teacher rescaled W_V / {k:g}, {k:g} W_O (the same function; teacher perplexity unchanged)'))
    return rows

REAL_TEACHERS = ('smollm2-135m',)

def real_teacher_rows(exp_rel):
    "Rows for a real pretrained teacher: each grid or retention cell with a naive copy and the paper's recipe (no gauge sweep)."
    exp = load_json(exp_rel)
    teacher, t_ppl = teacher_of(exp['setup']), exp['teacher_test_ppl']
    grid = {}
    for key, c in {**exp['grid'], **exp['retention']}.items():
        keep, init = key.split('|')
        grid.setdefault(keep, {})[init] = dict(zip(c['seeds'], c['values']))
    rows = []
    for keep, ppl in sorted(grid.items()):
        if not {'naive', 'taylor'} <= set(ppl): continue      # the gap closed is read against naive and taylor
        policy, kept = keep.split(':')
        rows.append(dict(source='package', model=teacher, policy=policy, kept=float(kept), k=1.0, headline=False,
                         eval_tokens=exp['setup']['eval_tokens'], ppl=dict(teacher=t_ppl, **ppl), files=[f'bench/results/{exp_rel}'],
                         note=f"first {exp['setup']['eval_tokens']:,} test tokens; seeds per init: "
                              + ', '.join(f'{i} {sorted(v)}' for i, v in ppl.items())))
    return rows

# ----- the arithmetic -----
def closed(naive, init, teacher):
    "Share of the log-perplexity gap between the naive copy and the teacher that `init` closes."
    return (math.log(naive) - math.log(init)) / (math.log(naive) - math.log(teacher))

def spread(f, *inputs):
    "f at the medians of its inputs (dicts seed -> value, or plain numbers), and its min and max over every seed combination."
    vals = [list(x.values()) if isinstance(x, dict) else [x] for x in inputs]
    combos = [f(*c) for c in product(*vals)]
    med = f(*[statistics.median(v) for v in vals])
    return dict(median=med, min=min(combos), max=max(combos)) if len(combos) > 1 else dict(median=med)

def derive(row):
    "Add perplexity summaries, naive/teacher, naive/taylor, naive/zero_gate, zero_gate/taylor and the gap each init closes."
    p, out = row['ppl'], dict(row)
    out['ppl'] = {k: (dict(median=statistics.median(v.values()), min=min(v.values()), max=max(v.values()), seeds=sorted(v), values=[v[s] for s in sorted(v)])
                      if isinstance(v, dict) else v) for k, v in p.items() if k == 'teacher' or k in INITS}
    ratio = lambda a, b: spread(lambda x, y: x / y, p[a], p[b]) if a in p and b in p else None
    best = 'taylor+' if 'taylor+' in p else 'taylor+ (gauge_fix off)'
    ratios = {'naive/teacher': ratio('naive', 'teacher'), 'naive/taylor': ratio('naive', 'taylor'),
              'naive/zero_gate': ratio('naive', 'zero_gate'), 'zero_gate/taylor': ratio('zero_gate', 'taylor'),
              f'naive/{best}': ratio('naive', best)}
    out.update(ratios)
    out = {k: v for k, v in out.items() if v is not None or k not in ratios}
    out['gap_closed'] = {i: dict(median=0.0) if i == 'naive' else spread(closed, p['naive'], p[i], p['teacher']) for i in INITS if i in p}
    if row['source'] == 'paper':
        alt = [(ppl, line) for (m, ppl), line in TEACHER_ALTERNATIVES.items() if m == row['model'] and ppl != p['teacher']]
        if alt: out['gap_closed_taylor_with_other_teacher_ppl'] = {f'{ppl} (line {line})': closed(p['naive'], p['taylor'], ppl) for ppl, line in alt}
    return out

def label(row):
    "A plain row label: model, kept fraction, policy (and k for gauge rows)."
    if row['kept'] is None: return f"{row['model']}, ablation (the 88\u00d7 row)"
    policy = row['policy'].upper() if row['policy'] in ('ar', 'ga-s2') else row['policy']   # the paper's acronyms
    return f"{row['model']}, {row['kept']:.0%} kept, " + (f"{policy}, k = {row['k']:g}" if row.get('k', 1.0) != 1.0 else policy)

def rng(d):
    "min-max over seeds, or the single value."
    return (d['min'], d['max']) if 'min' in d else (d['median'], d['median'])

def shipped(row) -> bool:
    "A row of this package's shipped tiny teachers."
    return row['source'] == 'package' and row['model'] not in REAL_TEACHERS

def summary(rows):
    "Min and max over the rows of each group of the ratios and gap shares (medians over seeds), for quoting."
    # the package's rows: the paper's policies only (its retrieval policy is compared with them in 08_results)
    ours = lambda r: r['source'] == 'package' and r['policy'] != 'retrieval'
    groups = {'paper, headline rows (88x row, Qwen3-8B 25 %, Llama-3.2-3B 50 %)': [r for r in rows if r['source'] == 'paper' and r['headline']],
              'paper, all zero-shot rows': [r for r in rows if r['source'] == 'paper'],
              'package, 25 % grid, both teachers (k = 1)': [r for r in rows if ours(r) and shipped(r) and r['k'] == 1.0 and r['kept'] == 0.25],
              'package, all k = 1 rows (grid and retention)': [r for r in rows if ours(r) and shipped(r) and r['k'] == 1.0],
              **{f'package, real teacher {t}, 25 %': [r for r in rows if ours(r) and r['model'] == t and r['kept'] == 0.25]
                 for t in REAL_TEACHERS}}
    out = {}
    for name, rs in groups.items():
        q = {}
        for key in ('naive/teacher', 'naive/taylor', 'naive/zero_gate', 'zero_gate/taylor'):
            v = [r[key]['median'] for r in rs if key in r]
            if v: q[key] = [min(v), max(v)]
        for init in ('zero_gate', 'taylor', 'taylor+', 'taylor+ (gauge_fix off)'):
            v = [r['gap_closed'][init]['median'] for r in rs if init in r['gap_closed']]
            if v: q[f'gap_closed {init}'] = [min(v), max(v)]
        out[name] = dict(rows=len(rs), **q)
    return out

# ----- the figure -----
STYLE = {  # init: (legend label, colour, marker)
    'naive': ('naive copy', '#7a7a7a', 'square'),
    'zero_gate': ('zero output gate', '#d55e00', 'diamond'),
    'taylor': ("paper's init (taylor)", '#0072b2', 'circle'),
    'taylor+': ('taylor+ (this package)', '#009e73', 'triangle'),
    'taylor+ (gauge_fix off)': ('taylor+ (gauge_fix off)', '#009e73', 'triangle-open'),
}
W, LABEL_W, PLOT_L, PLOT_R, RIGHT_W = 800, 262, 272, 704, 90
X_MIN, X_MAX = -0.4, 1.0            # a value below X_MIN is drawn as an arrow at the left edge with its number

def pct(v):
    "A share as a whole percentage, with a real minus sign."
    return f'{v:.0%}'.replace('-', '\u2212')

def esc(s: str) -> str:
    "Text escaped for SVG."
    return html.escape(s, quote=False)

def marker(kind, x, y, colour, size=5.0):
    "One SVG marker centred at (x, y)."
    if kind == 'square': return f'<rect x="{x - size*0.8:.1f}" y="{y - size*0.8:.1f}" width="{size*1.6:.1f}" height="{size*1.6:.1f}" fill="{colour}"/>'
    if kind == 'diamond':
        return f'<path d="M{x:.1f},{y - size*1.1:.1f} L{x + size*1.1:.1f},{y:.1f} L{x:.1f},{y + size*1.1:.1f} L{x - size*1.1:.1f},{y:.1f} Z" fill="{colour}"/>'
    if kind == 'circle': return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{size:.1f}" fill="{colour}"/>'
    tri = f'M{x:.1f},{y - size*1.1:.1f} L{x + size*1.1:.1f},{y + size*0.8:.1f} L{x - size*1.1:.1f},{y + size*0.8:.1f} Z'
    if kind == 'triangle': return f'<path d="{tri}" fill="{colour}"/>'
    return f'<path d="{tri}" fill="white" stroke="{colour}" stroke-width="1.6"/>'

def xpos(v):
    "The x pixel of a share (clipped to the axis)."
    return PLOT_L + (min(max(v, X_MIN), X_MAX) - X_MIN) / (X_MAX - X_MIN) * (PLOT_R - PLOT_L)

def figure_groups(rows):
    "The figure's row groups: (heading, rows)."
    pkg = lambda t: [r for r in rows if r['source'] == 'package' and r['model'] == t and r['k'] == 1.0]
    gauge = [r for r in rows if shipped(r) and r['k'] in (10.0, 100.0) and r['kept'] == 0.25]
    real = lambda t: (f"This package, a real pretrained teacher, {t} (perplexity {pkg(t)[0]['ppl']['teacher']:.1f} on {pkg(t)[0]['eval_tokens']:,} test tokens): "
                      'median over the seeds run')
    head = lambda t: f"This package, teacher {t} (perplexity {pkg(t)[0]['ppl']['teacher']:.1f}): median over seeds, line = min\u2013max"
    return [("Paper (authors' released results): the 88\u00d7 row and the settings around it", [r for r in rows if r['source'] == 'paper' and r['headline']]),
            ("Paper: the other retained fractions of the authors' zero-shot sweeps", [r for r in rows if r['source'] == 'paper' and not r['headline']]),
            *[(real(t), pkg(t)) for t in REAL_TEACHERS if pkg(t)],
            (head('tiny-qwen2'), pkg('tiny-qwen2')), (head('tiny-qwen3'), pkg('tiny-qwen3')),
            ('This package, teacher rescaled to W_V / k, k W_O (the same function): tiny-qwen2 3 seeds, tiny-qwen3 1', sorted(gauge, key=lambda r: (r['model'], r['k'])))]

def svg(rows):
    "The figure: per row, the share of the log-perplexity gap each init closes, grouped paper / package."
    row_h, head_h, top = 19, 24, 118
    groups = figure_groups(rows)
    n = sum(len(rs) for _, rs in groups)
    H = top + n * row_h + len(groups) * head_h + 62
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         '<text x="12" y="26" font-size="17" font-weight="bold" fill="#222">How much of the gap to the teacher does each initialisation close?</text>',
         '<text x="12" y="46" font-size="12" fill="#444">Share of the gap closed = (ln PPL<tspan font-size="9" dy="3">naive</tspan><tspan dy="-3"> \u2212 ln PPL</tspan>'
         '<tspan font-size="9" dy="3">init</tspan><tspan dy="-3">) / (ln PPL</tspan><tspan font-size="9" dy="3">naive</tspan><tspan dy="-3"> \u2212 ln PPL</tspan>'
         '<tspan font-size="9" dy="3">teacher</tspan><tspan dy="-3">), zero-shot: 0% = naive copy, 100% = teacher</tspan></text>']
    lx = 12
    for init, (name, colour, kind) in STYLE.items():          # legend
        o.append(marker(kind, lx + 6, 68, colour))
        o.append(f'<text x="{lx + 15}" y="72" font-size="12" fill="#222">{esc(name)}</text>')
        lx += 28 + 6.2 * len(name)
    axis_y = top - 14
    for t in (-0.25, 0, 0.25, 0.5, 0.75, 1.0):                # axis labels and grid
        x = xpos(t)
        o.append(f'<text x="{x:.1f}" y="{axis_y - 6}" font-size="11" fill="#555" text-anchor="middle">{pct(t)}</text>')
        o.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{H - 52}" stroke="{"#999" if t in (0, 1.0) else "#e3e3e3"}" stroke-width="1"/>')
    o.append(f'<rect x="{PLOT_L}" y="{axis_y}" width="{xpos(0) - PLOT_L:.1f}" height="{H - 52 - axis_y}" fill="#f6f0f0"/>')
    o.append(f'<text x="{(PLOT_L + xpos(0)) / 2:.1f}" y="{axis_y + 12}" font-size="9" fill="#a66" text-anchor="middle">worse than naive</text>')
    o.append(f'<text x="{PLOT_R + RIGHT_W / 2:.1f}" y="{axis_y - 20}" font-size="11" fill="#555" text-anchor="middle">naive copy /</text>')
    o.append(f'<text x="{PLOT_R + RIGHT_W / 2:.1f}" y="{axis_y - 6}" font-size="11" fill="#555" text-anchor="middle">teacher</text>')
    y = top
    for heading, rs in groups:
        o.append(f'<text x="12" y="{y + 15}" font-size="12" font-weight="bold" fill="#333">{esc(heading)}</text>')
        y += head_h
        for r in rs:
            cy = y + row_h / 2
            o.append(f'<text x="{LABEL_W}" y="{cy + 4:.1f}" font-size="12" fill="#222" text-anchor="end">{esc(label(r))}</text>')
            o.append(f'<line x1="{PLOT_L}" y1="{cy:.1f}" x2="{PLOT_R}" y2="{cy:.1f}" stroke="#f0f0f0"/>')
            for init in ('naive', 'zero_gate', 'taylor+ (gauge_fix off)', 'taylor', 'taylor+'):
                if init not in r['gap_closed']: continue
                d, (_, colour, kind) = r['gap_closed'][init], STYLE[init]
                lo, hi = rng(d)
                if hi > lo: o.append(f'<line x1="{xpos(lo):.1f}" y1="{cy:.1f}" x2="{xpos(hi):.1f}" y2="{cy:.1f}" stroke="{colour}" stroke-width="2" opacity="0.6"/>')
                if d['median'] < X_MIN:                        # off the left edge: an arrow and the value
                    o.append(f'<path d="M{PLOT_L - 2},{cy:.1f} L{PLOT_L + 8},{cy - 5:.1f} L{PLOT_L + 8},{cy + 5:.1f} Z" fill="{colour}"/>')
                    o.append(f'<text x="{PLOT_L + 11}" y="{cy + 4:.1f}" font-size="9" fill="{colour}">{pct(d["median"])}</text>')
                else: o.append(marker(kind, xpos(d['median']), cy, colour))
            nt = r['naive/teacher']['median']
            o.append(f'<text x="{PLOT_R + RIGHT_W / 2:.1f}" y="{cy + 4:.1f}" font-size="12" fill="#222" text-anchor="middle">'
                     f'{nt:,.0f}\u00d7</text>' if nt >= 10 else f'<text x="{PLOT_R + RIGHT_W / 2:.1f}" y="{cy + 4:.1f}" font-size="12" fill="#222" text-anchor="middle">{nt:.2f}\u00d7</text>')
            y += row_h
    o.append(f'<text x="12" y="{H - 30}" font-size="11" fill="#555">Right: naive copy / teacher perplexity, the ceiling on any init\u2019s gain over a naive copy. '
             f'The paper\u2019s 88\u00d7 row closes {[r for r in rows if r["kept"] is None][0]["gap_closed"]["taylor"]["median"]:.0%} of its gap.</text>')
    o.append(f'<text x="12" y="{H - 14}" font-size="11" fill="#555">Paper rows: single runs from the authors\u2019 result files. GA-S2 picks layers per init. '
             'Numbers: bench/results/gap_closed.json</text>')
    o.append('</svg>')
    return '\n'.join(o) + '\n'

def compute() -> tuple[dict, str]:
    "Every row, the summary and the figure: (the JSON document, the SVG text)."
    check = check_paper_numbers()
    rows = [derive(dict(source='paper', **r)) for r in PAPER]
    rows += [derive(r) for r in package_rows('experiments/experiments.json', 'gauge/gauge.json')]
    rows += [derive(r) for r in package_rows('experiments_tiny-qwen3/experiments.json', 'gauge_tiny-qwen3/gauge.json')]
    rows += [derive(r) for t in REAL_TEACHERS for r in real_teacher_rows(f'experiments_{t}/experiments.json')]
    for r in rows: r['label'] = label(r)
    res = dict(definition='gap_closed[init] = (ln ppl_naive - ln ppl_init) / (ln ppl_naive - ln ppl_teacher); naive/taylor = naive/zero_gate x zero_gate/taylor',
               aggregation='paper rows: single runs. package rows: perplexity medians over seeds (with min, max, values); derived numbers from the '
                           'medians, min/max over every combination of the seeds of their inputs',
               paper_source="the authors' released result files as extracted in reference-implementation.md (sections 9.1 and 9.4 tables; "
                            'line numbers per row under "lines")', paper_check=check,
               summary=summary(rows), rows=rows)
    return json.loads(json.dumps(res)), svg(rows)

def main():
    "Compute every row, write the JSON and the SVG, print a short table."
    res, figure = compute()
    OUT_JSON.write_text(json.dumps(res, indent=1))
    OUT_SVG.write_text(figure)
    print(res['paper_check'])
    for r in res['rows']:
        g = r['gap_closed']
        print(f"{r['source']:7} {r['label']:42} naive/teacher {r['naive/teacher']['median']:9.2f}  closed: "
              + '  '.join(f"{i} {g[i]['median']:6.1%}" for i in ('zero_gate', 'taylor', 'taylor+', 'taylor+ (gauge_fix off)') if i in g))
    print('wrote', OUT_JSON.relative_to(ROOT), 'and', OUT_SVG.relative_to(ROOT))

if __name__ == '__main__':
    main()
