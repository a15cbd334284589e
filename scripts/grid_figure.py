"""The landing page's first figure: each initialisation's test perplexity over its teacher's, on a real pretrained teacher
and on the shipped one, a quarter of the layers kept as attention.

    .venv/bin/python scripts/grid_figure.py      # -> nbs/images/grid.svg

Reads the grid cell `uniform:0.25` of bench/results/experiments_smollm2-135m/experiments.json (22 of the 30 layers of
SmolLM2-135M converted, the first 8,192 test tokens) and of bench/results/experiments/experiments.json (6 of the 8 layers
of tiny-qwen2 converted, the whole test split), both written by scripts/experiments.py; the calibration budgets come from
the package's recipes (`taylor_calibrate.core.get_recipe`). A static SVG, so that README.md shows it on a code host.
"""
import html, json, math, statistics
from pathlib import Path
from taylor_calibrate.core import get_recipe

ROOT = Path(__file__).resolve().parents[1]
TEACHERS = {  # name shown: (results file, what was converted)
    'SmolLM2-135M': (ROOT/'bench'/'results'/'experiments_smollm2-135m'/'experiments.json', '22 of 30 layers converted'),
    'tiny-qwen2 (shipped)': (ROOT/'bench'/'results'/'experiments'/'experiments.json', '6 of 8 layers converted')}
OUT = ROOT/'nbs'/'images'/'grid.svg'
CELL = 'uniform:0.25'
# init: (label, what it sets)
LABELS = {'naive': ('naive copy', 'weights copied, GDN dynamics at defaults'),
          'zero_gate': ('naive copy, output gate zeroed', 'converted layers start silent'),
          'phase1': ('Phase 1 only', 'closed form, from teacher statistics'),
          'phase2': ('Phase 2 only', 'each layer aligned to its teacher layer'),
          'taylor': ("the paper's recipe (taylor)", 'Phase 1, then Phase 2'),
          'taylor+': ('taylor+ (this package)', 'balanced gauge, exact targets, more data')}
W, LEFT, RIGHT, TOP, ROW, BAR = 800, 290, 700, 130, 50, 17
DECADES = 5                                     # the axis: 1x to 10^5 x the teacher's perplexity
COLOURS = {'SmolLM2-135M': '#1f78b4', 'tiny-qwen2 (shipped)': '#b2b2b2'}

def esc(s: str) -> str:
    "Text escaped for SVG."
    return html.escape(s, quote=False)

def bars(results: dict) -> list[dict]:
    "One row per init: for each teacher, its perplexity over the teacher's (median, min, max over the seeds run)."
    rows = []
    for init, (label, note) in LABELS.items():
        row = dict(key=init, label=label, note=note, teachers={})
        for name, r in results.items():
            t, v = r['teacher_test_ppl'], r['grid'][f'{CELL}|{init}']['values']
            row['teachers'][name] = dict(median=statistics.median(v) / t, lo=min(v) / t, hi=max(v) / t, n=len(v))
        rows.append(row)
    return rows

def load() -> dict:
    "Each teacher's committed experiments.json."
    return {name: json.loads(path.read_text()) for name, (path, _) in TEACHERS.items()}

def xpos(ratio: float) -> float:
    "Horizontal position of a perplexity ratio on the log axis."
    return LEFT + math.log10(ratio) / DECADES * (RIGHT - LEFT)

def times(ratio: float) -> str:
    "A ratio as the figure prints it: 24,757x, 11.9x, 1.09x."
    return f'{ratio:,.0f}x' if ratio >= 100 else f'{ratio:.3g}x'

def caption(rows: list[dict], results: dict) -> list[str]:
    "The figure's caption lines, every number from the results or the recipes."
    paper, ours = get_recipe('taylor'), get_recipe('taylor+')
    return [f"Test perplexity: SmolLM2-135M on the first {results['SmolLM2-135M']['setup']['eval_tokens']:,} test tokens "
            f"(teacher {results['SmolLM2-135M']['teacher_test_ppl']:.2f}), tiny-qwen2 on the whole test split "
            f"(teacher {results['tiny-qwen2 (shipped)']['teacher_test_ppl']:.2f}).",
            f"Calibration tokens: {paper.calib_tokens:,} for the paper's recipes, {ours.calib_tokens:,} for taylor+ "
            f"(its Phase 2 in mini-batches with early stopping on {ours.heldout_tokens:,} held-out tokens).",
            "Calibration on the training split, evaluation on the test split; every policy, more seeds and recovery: 08 Results."]

def svg(rows: list[dict], results: dict) -> str:
    "The grouped bar chart as an SVG document."
    names = list(TEACHERS)
    seeds = {n: sorted({r['teachers'][n]['n'] for r in rows}) for n in names}   # the seeds each teacher's bars rest on
    height = TOP + ROW * len(rows) + 100
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" '
           'font-family="Helvetica, Arial, sans-serif">', f'<rect width="{W}" height="{height}" fill="white"/>',
           "<text x=\"12\" y=\"26\" font-size=\"18\" font-weight=\"bold\">Test perplexity over the teacher's, a quarter of "
           'the layers kept as attention</text>',
           '<text x="12" y="47" font-size="13" fill="#333">each bar: an initialisation of the converted layers; log scale, '
           '1x = the teacher; line = min to max over seeds</text>']
    for i, n in enumerate(names):                                                  # one legend entry a line
        s, y = seeds[n], 60 + 18 * i
        label = (f'{n}: {TEACHERS[n][1]}, ' + ('seed 0' if s == [1] else f'median of {s[0]} seeds' if len(s) == 1
                                              else f'median of {s[0]} to {s[-1]} seeds'))
        out += [f'<rect x="12" y="{y}" width="14" height="12" fill="{COLOURS[n]}"/>',
                f'<text x="32" y="{y + 11}" font-size="12.5">{esc(label)}</text>']
    for e in range(DECADES + 1):
        x = xpos(10 ** e)
        out += [f'<line x1="{x:.1f}" y1="{TOP - 14}" x2="{x:.1f}" y2="{TOP + ROW * len(rows) - 8}" stroke="{"#555" if e == 0 else "#e4e4e4"}"/>',
                f'<text x="{x:.1f}" y="{TOP - 20}" font-size="11" fill="#666" text-anchor="middle">{times(10 ** e)}</text>']
    for i, r in enumerate(rows):
        y = TOP + ROW * i
        out += [f'<text x="{LEFT - 10}" y="{y + 12}" font-size="13" text-anchor="end" font-weight="bold">{esc(r["label"])}</text>',
                f'<text x="{LEFT - 10}" y="{y + 28}" font-size="10.5" fill="#555" text-anchor="end">{esc(r["note"])}</text>']
        for j, n in enumerate(names):
            b = r['teachers'][n]
            yb = y - 4 + j * (BAR + 2)
            x, x0, x1 = xpos(b['median']), xpos(b['lo']), xpos(b['hi'])
            out += [f'<rect x="{LEFT}" y="{yb}" width="{max(x - LEFT, 1):.1f}" height="{BAR}" fill="{COLOURS[n]}"/>',
                    f'<text x="{max(x, x1) + 6:.1f}" y="{yb + 13}" font-size="12">{times(b["median"])}</text>']
            if b['hi'] > b['lo']:
                out.append(f'<line x1="{x0:.1f}" y1="{yb + BAR / 2}" x2="{x1:.1f}" y2="{yb + BAR / 2}" stroke="black" stroke-width="1.5"/>')
    y = TOP + ROW * len(rows) + 14
    out += [f'<text x="12" y="{y + 17 * i}" font-size="11.5" fill="#333">{esc(line)}</text>' for i, line in enumerate(caption(rows, results))]
    return '\n'.join(out + ['</svg>']) + '\n'

def main():
    results = load()
    rows = bars(results)
    OUT.write_text(svg(rows, results))
    for r in rows:
        print(f"{r['label']:<32}", '   '.join(f"{n} {b['median']:,.2f}x" for n, b in r['teachers'].items()))
    print(f'wrote {OUT}')

if __name__ == '__main__': main()
