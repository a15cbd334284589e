"""The landing page's first figure: test perplexity of the shipped teacher and of its hybrids, one bar per initialisation.

    .venv/bin/python scripts/grid_figure.py      # -> nbs/images/grid.svg

Reads the grid cell `uniform:0.25` (6 of the 8 layers of tiny-qwen2 converted, attention kept in layers 0 and 4) of
bench/results/experiments/experiments.json, written by scripts/experiments.py; the calibration budgets come from the
package's recipes (`taylor_calibrate.core.get_recipe`). A static SVG, so that README.md shows it on a code host.
"""
import html, json, math, statistics
from pathlib import Path
from taylor_calibrate.core import get_recipe

ROOT = Path(__file__).resolve().parents[1]
RESULTS, OUT = ROOT/'bench'/'results'/'experiments'/'experiments.json', ROOT/'nbs'/'images'/'grid.svg'
CELL = 'uniform:0.25'
# init: (label, what it sets)
LABELS = {'naive': ('naive copy', 'weights copied, GDN dynamics at defaults'),
          'zero_gate': ('naive copy, output gate zeroed', 'converted layers start silent'),
          'phase1': ('Phase 1 only', 'closed form, from teacher statistics'),
          'phase2': ('Phase 2 only', 'each layer aligned to its teacher layer'),
          'taylor': ("the paper's recipe (taylor)", 'Phase 1, then Phase 2'),
          'taylor+': ('taylor+ (this package)', 'balanced gauge, exact targets, more data')}
W, LEFT, RIGHT, TOP, ROW = 800, 290, 720, 92, 44
COLOURS = {'teacher': '#555555', 'naive': '#9e9e9e', 'zero_gate': '#d95f02', 'phase1': '#e6ab02', 'phase2': '#7570b3',
           'taylor': '#1f78b4', 'taylor+': '#1b9e77'}

def esc(s: str) -> str:
    "Text escaped for SVG."
    return html.escape(s, quote=False)

def bars(results: dict) -> list[dict]:
    "One row per init of the cell (median, min, max over seeds), the teacher first."
    t = results['teacher_test_ppl']
    rows = [dict(key='teacher', label='teacher', note='no layer converted', median=t, lo=t, hi=t, n=1)]
    for init, (label, note) in LABELS.items():
        v = results['grid'][f'{CELL}|{init}']['values']
        rows.append(dict(key=init, label=label, note=note, median=statistics.median(v), lo=min(v), hi=max(v), n=len(v)))
    return rows

def xpos(v: float, lo: float, hi: float) -> float:
    "Horizontal position of a perplexity on the log axis."
    return LEFT + (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo)) * (RIGHT - LEFT)

def caption(rows: list[dict]) -> list[str]:
    "The figure's caption lines, every number from the results or the recipes."
    r = {row['key']: row for row in rows}
    paper, ours = get_recipe('taylor'), get_recipe('taylor+')
    return [f"Phase 1 alone starts the output gate small (damping {paper.damping}), so the hybrid starts about as quiet as with the gate",
            f"zeroed ({r['phase1']['median']:.1f} and {r['zero_gate']['median']:.1f}); Phase 2 opens it. A naive copy is "
            f"{r['naive']['median'] / r['teacher']['median']:.1f}x the teacher here, so no init can gain more than that.",
            f"Calibration tokens: {paper.calib_tokens:,} for the paper's recipes, {ours.calib_tokens:,} for taylor+ "
            f"(its Phase 2 in mini-batches with early stopping on {ours.heldout_tokens:,} held-out tokens).",
            "Calibration on the training split, evaluation on the test split; the grid, the retention sweep and recovery: 08 Results."]

def svg(rows: list[dict]) -> str:
    "The bar chart as an SVG document."
    lo, hi = 30, 125
    height = TOP + ROW * len(rows) + 110
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" '
           'font-family="Helvetica, Arial, sans-serif">', f'<rect width="{W}" height="{height}" fill="white"/>',
           '<text x="12" y="26" font-size="18" font-weight="bold">Test perplexity of the shipped teacher and its hybrids</text>',
           f'<text x="12" y="47" font-size="13" fill="#333">tiny-qwen2 with 6 of its 8 layers converted (attention kept in '
           f'layers 0 and 4); median of {rows[1]["n"]} seeds, line = min to max; log scale</text>']
    for v in (30, 40, 50, 60, 80, 100, 120):
        x = xpos(v, lo, hi)
        out += [f'<line x1="{x:.1f}" y1="{TOP - 14}" x2="{x:.1f}" y2="{TOP + ROW * len(rows) - 10}" stroke="#e4e4e4"/>',
                f'<text x="{x:.1f}" y="{TOP - 20}" font-size="11" fill="#666" text-anchor="middle">{v}</text>']
    t = xpos(rows[0]['median'], lo, hi)
    out.append(f'<line x1="{t:.1f}" y1="{TOP - 14}" x2="{t:.1f}" y2="{TOP + ROW * len(rows) - 10}" stroke="#555" stroke-dasharray="4 3"/>')
    for i, r in enumerate(rows):
        y = TOP + ROW * i
        x, x0, x1 = xpos(r['median'], lo, hi), xpos(r['lo'], lo, hi), xpos(r['hi'], lo, hi)
        out += [f'<text x="{LEFT - 10}" y="{y + 8}" font-size="13" text-anchor="end" font-weight="bold">{esc(r["label"])}</text>',
                f'<text x="{LEFT - 10}" y="{y + 24}" font-size="10.5" fill="#555" text-anchor="end">{esc(r["note"])}</text>',
                f'<rect x="{LEFT}" y="{y - 4}" width="{x - LEFT:.1f}" height="20" fill="{COLOURS[r["key"]]}" opacity="0.85"/>',
                f'<text x="{max(x, x1) + 6:.1f}" y="{y + 11}" font-size="12">{r["median"]:.1f}</text>']
        if r['hi'] > r['lo']: out.append(f'<line x1="{x0:.1f}" y1="{y + 6}" x2="{x1:.1f}" y2="{y + 6}" stroke="black" stroke-width="1.5"/>')
    y = TOP + ROW * len(rows) + 14
    out += [f'<text x="12" y="{y + 17 * i}" font-size="11.5" fill="#333">{esc(line)}</text>' for i, line in enumerate(caption(rows))]
    return '\n'.join(out + ['</svg>']) + '\n'

def main():
    rows = bars(json.loads(RESULTS.read_text()))
    OUT.write_text(svg(rows))
    for r in rows: print(f"{r['label']:<32} {r['median']:7.2f}  ({r['lo']:.2f} to {r['hi']:.2f})")
    print(f'wrote {OUT}')

if __name__ == '__main__': main()
