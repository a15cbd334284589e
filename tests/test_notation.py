"""One symbol per quantity in every notebook: the notation table of `00_taylor` (its section *Notation*).

What is checked: every notebook under `nbs/` (`nbs/modules/` included), in what a reader reads as mathematics:
- markdown cells, with fenced code blocks and inline code removed first (an identifier such as `k` in
  `rescale_value_output(teacher, k)` is code, not a symbol);
- the comments, docstrings and string literals of code cells (plot labels, legends, table headings).

What fails, each another symbol for a quantity the table names:
- the half-life as `h` (`h` is only the head index) or in words inside a formula: `2^{-1/h}`, `\\ln 2/h`,
  "half-life $h$", `t_{1/2} = h`, `2^{-1/\\text{half-life}}` (it is $t_{1/2}$);
- `c_h` or a bare `c` for the concentration (it is $\\kappa_h$) or for the teacher's attention context (it is $c_{t,h}$):
  `c_h`, `c_{h}`, `c<sub>h</sub>`, `0.3 + 0.4\\,c`, `0.30 + {span:.2f} c`, "concentration $c$", `c = 0.5`;
- the teacher's attention context as `\\bar v` (it is $c_{t,h}$);
- the value/output gauge factor as `k` (it is $\\rho$, per layer and KV head $\\rho_{\\ell,h}$; $k_t$ are keys):
  `k_h`, `k_{h}`, `W_V/k`, `k W_O`, "factor k", "gauge k", `k \\cdot RMS`, and, in a cell about the gauge, a bare `k`
  in LaTeX (`$k$`, `$k = 10$`) or a label such as `'k = 10'`;
- the per-token decay as `\\lambda` (`\\lambda` is the ridge of a least-squares fit; the decay is $e^{g_t}$):
  `\\lambda_t`, `\\lambda^{t-s}`, `\\lambda = e^{g}`, `1-\\lambda`.
Keys $k_t$, $k_s$, $k_{t,h}$, `kk^\\top`, the triple $q, k, v$ and the ridge $(G + \\lambda I)$ are not hits.
"""
import ast, io, json, re, tokenize
from pathlib import Path
import pytest
from test_wording import strip_code       # markdown without fenced code and inline code spans

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT/'nbs'

MATH = re.compile(r'\$\$.*?\$\$|\$[^$\n]+\$', re.S)
QKV = re.compile(r'q\s*[,/]\s*k\s*[,/]\s*v')   # the triple of projections, not a factor
NB = r'(?![\w{])'                                # not followed by a letter, digit, _ or a brace
OLD = {
    'half-life as h': [r'\^\{?-[^{}$]*?/\s*h\}', r'\\ln\s*2\s*/\s*h' + NB, r'half-?life\s+(?:of\s+)?\$h\$', r't_\{1/2\}\s*=\s*h' + NB,
                       r'/\s*\\text\{half-?life\}'],
    'concentration or context as c_h': [r'(?<![\w\\])c_(?:h' + NB + r'|\{h\})', r'c<sub>h</sub>',
                                        r'0\.4\s*(?:\\[,;:!]\s*|\\cdot\s*|\\times\s*|[*·×]\s*)?c' + NB,
                                        r'\+\s*\{[^{}]*\}\s*c' + NB, r'\\beta_\{span\}\s*(?:\\,\s*)?c' + NB,
                                        r'concentrations?\s+\$?c' + NB, r'\$c\s*=\s*[\d.]'],
    'context as \\bar v': [r'\\bar\s*\{?\s*v'],
    'gauge factor as k': [r'(?<![\w\\])k_(?:h' + NB + r'|\{h\}|\{\\ell,\s*h\})', r'k<sub>h</sub>',
                          r'W_\{?V\}?\s*/\s*k' + NB, r'(?<![\w\\])k\s*(?:\\[,;!]\s*)?W_\{?O', r'\bfactors?\s+\$?k' + NB,
                          r'\bgauge\s+\$?k' + NB, r'(?<![\w\\])k\s*(?:\\cdot|\\times|[*·×])\s*\\?(?:mathrm\{|text\{)?RMS',
                          r'\bby\s+\$?1\s*/\s*k' + NB],
    'decay as \\lambda': [r'\\lambda_t', r'\\lambda\s*\^', r'\\lambda\s*=\s*(?:e\^|2\^|0?\.\d)', r'1\s*-\s*\\lambda', r'\\lambda\s*\\?,?\s*\(1\s*-'],
}
OLD = {name: [re.compile(p) for p in pats] for name, pats in OLD.items()}
GAUGE_CELL = re.compile(r'\bgauge', re.I)
BARE_K_MATH = re.compile(r'(?<![\w\\])k(?![\w^_{])')               # in LaTeX: $k$, $k = 10$, $1/k$; not k_t, kk^\top
BARE_K_STRING = re.compile(r'(?<![\w.\\/\'"-])k\s*(?:=|<=|>=)\s*(?:[\d{]|$)|\bby\s+k\b|\s/\s*k\b|\'s\s+k\b')  # 'k = 10', 'by k', 'rate / k'
K_VALUE_STRING = re.compile(r'(?:\b(?:at|from|to)\s+|\(|^\s*)k\s*=\s*[\d.{]')   # 'at k = 1', 'from k=1 to k=10', '(k = 1)'
K_VALUE_MATH = re.compile(r'(?<![\w\\])k\s*(?:=|\\in)\s*[\d.\\{]')   # $k = 10$, $k \in \{...\}$: a value, never a key


def code_texts(src: str) -> list:
    "The comments, docstrings and string literals of Python source (magics and shell lines blanked first); a subscript's key is data, not text."
    src = '\n'.join('' if l.lstrip().startswith(('!', '%')) else l for l in src.splitlines()) + '\n'
    out = []
    try:
        out += [t.string for t in tokenize.generate_tokens(io.StringIO(src).readline)
                if t.type == tokenize.COMMENT and not t.string.startswith(('#|', '# %%'))]
    except (tokenize.TokenError, IndentationError, SyntaxError): pass
    try: tree = ast.parse(src)
    except SyntaxError: return out
    keys = {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)}   # d['key']: data, not a label
    return out + [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in keys]

def old_uses(text: str, kind: str = 'markdown', gauge_cell: bool = False, gauge_notebook: bool = False) -> list:
    "(rule, the text around it) for each old use in `text`, a markdown cell (`kind='markdown'`) or a code cell's string or comment."
    if kind == 'markdown': text = strip_code(text)
    hits = [(name, text[max(0, m.start() - 30):m.end() + 30]) for name, pats in OLD.items() for p in pats for m in p.finditer(text)]
    if gauge_notebook and not gauge_cell:
        if kind == 'markdown':
            for math in MATH.finditer(text):
                hits += [('gauge factor as k', math.group(0)[max(0, m.start() - 30):m.end() + 30]) for m in K_VALUE_MATH.finditer(math.group(0))]
        else: hits += [('gauge factor as k', text[max(0, m.start() - 30):m.end() + 30]) for m in K_VALUE_STRING.finditer(text)]
    if gauge_cell:
        if kind == 'markdown':
            for math in MATH.finditer(text):
                m_text = QKV.sub('', math.group(0))
                hits += [('gauge factor as k', m_text[max(0, m.start() - 30):m.end() + 30]) for m in BARE_K_MATH.finditer(m_text)]
        else: hits += [('gauge factor as k', text[max(0, m.start() - 30):m.end() + 30]) for m in BARE_K_STRING.finditer(text)]
    return hits

def notebook_old_uses(path: Path) -> list:
    "'notebook cell i (id): rule: text' for every old use in the notebook at `path`."
    nb, out = json.loads(path.read_text(encoding='utf-8')), []
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    gauge_notebook = any(c['cell_type'] == 'markdown' and GAUGE_CELL.search(''.join(c['source'])) for c in nb['cells'])
    for i, cell in enumerate(nb['cells']):
        src = ''.join(cell['source'])
        if cell['cell_type'] == 'markdown': texts, kind = [src], 'markdown'
        elif cell['cell_type'] == 'code': texts, kind = code_texts(src), 'code'
        else: continue
        gauge = any(GAUGE_CELL.search(strip_code(t) if kind == 'markdown' else t) for t in texts)
        for t in texts:
            for name, around in old_uses(t, kind, gauge, gauge_notebook):
                out.append(f"{where} cell {i} ({cell.get('id', '')}): {name}: {' '.join(around.split())}")
    return out

NOTEBOOKS = sorted(NBS.rglob('*.ipynb'))

@pytest.mark.parametrize('path', NOTEBOOKS, ids=[str(p.relative_to(NBS)) for p in NOTEBOOKS])
def test_one_symbol_per_quantity(path):
    hits = notebook_old_uses(path)
    assert not hits, '\n'.join(hits)

def test_the_rules_themselves():
    old = [r'$$r = \beta\,\big(2^{-1/h}(1-\beta/d_k)\big)^{t-s}$$', r'a half-life of $h$ tokens', r'$\lambda = 2^{-\Delta/h}$',
           r'$\beta^*_h = 0.3 + 0.4\,c_h$', r'a concentration $c_h \in [0,1]$', r'$\beta^* = 0.3+0.4\,c$', r'we return $c=0.5$',
           'concentration c<sub>h</sub>', r'$\mathrm{RMS}(c_h)$', r'$\langle c_{h}, o_h\rangle$', r'the context $\bar v_{t,h}$',
           r'$W_V \to W_V/k$', r'$W_O \to k\,W_O$', 'k W_O per KV head', r'rescaled by $k_h > 0$', 'the gauge factor k',
           r'$\lVert k_h W_O^{(h)}\rVert$', r'magnitude $k\cdot\mathrm{RMS}(\mathrm{silu}(W_gx))$', 'geometric mean of k<sub>h</sub>',
           r'$K = 2^{-(t-s)/\text{half-life}}$', "β* = {lo:.2f} + {span:.2f} c against entropy", r'$\beta_{lo} + \beta_{span}\,c$',
           r'a decay $\lambda_t = e^{g_t}$', r'weights $\lambda^{t-s}(1+x_{ts})$', r'$\sigma^* = 1-\lambda$', r'decay $\lambda=0.95$']
    for s in old: assert old_uses(s), s
    assert old_uses(r'at the gauge $k = 10$ the outputs shrink', gauge_cell=True)
    assert old_uses(r'the gauge: its perplexity at $k = 1$', gauge_cell=True)
    assert old_uses('k = {k:g}', 'code', gauge_cell=True)
    assert old_uses('a rescaling by k <= 0 is not a gauge transformation', 'code', gauge_cell=True)
    assert old_uses(r'at $k = 10$ the head outputs are ten times smaller', gauge_notebook=True)
    assert old_uses('naive branch grows {g:.1f}x from k=1 to k=10', 'code', gauge_notebook=True)
    assert old_uses("with the gauge, W_V's rate / k", 'code', gauge_cell=True)
    assert code_texts("g['both teachers (k = 1)']  # k W_O") == ['# k W_O']
    assert not old_uses('top k = 9 layers', 'code', gauge_notebook=True) and not old_uses('dict(k=k)', 'code', gauge_notebook=True)
    assert not old_uses(r'with a unit key $k$, reading with $k$ returns', gauge_notebook=True)
    assert old_uses('heads with concentrations c in [0, 1]', 'code') and old_uses("by 1/k and o_proj's columns by k", 'code')
    new = [r'$$r = \beta\,\big(2^{-1/t_{1/2}}(1-\beta/d_k)\big)^{t-s}$$', r'$\beta^*_h = 0.3 + 0.4\,\kappa_h$',
           r'the context $c_{t,h} = \sum_s p(t,s)\,v_{s,h}$', r'$\mathrm{RMS}(c_{t,h})$', r'$W_V \to W_V/\rho$, $W_O \to \rho\,W_O$',
           r'$S_t = e^{g_t}S_{t-1}(I-\beta_tk_tk_t^\top)+\beta_tv_tk_t^\top$', r'keys $k_s$ and $k_{t,h}$', r'reading with $k_t$',
           r'$\beta v_1k^\top(I-\beta kk^\top)$', 'the call `rescale_value_output(teacher, k)`', 'per head $h$ and input $x_t$',
           r'gradients reach $q,k,v$', 'the half-life $t_{1/2,h}$ of head $h$', 'the mean distance $d_h$ and entropy $H_h$',
           r'$K = 2^{-(t-s)/t_{1/2}}$', "β* = {lo:.2f} + {span:.2f} κ against entropy", r'solves $(G + \lambda I) W = B$',
           r'$\lambda$ a small fraction of the mean diagonal', r'$e^{g(t-s)}(1+x_{ts})$ and $\sigma^*=1-e^{g}$', 'channel $c$ of head $h$']
    for s in new: assert not old_uses(s), s
    assert not old_uses(r'the gauge: gradients reach $q, k, v$ and keys $k_t$', gauge_cell=True)
    assert not old_uses(r'`k = 2` in the call', gauge_cell=True)
    assert not old_uses("dict(k=k, init=init)", 'code', gauge_cell=True)

def test_a_planted_old_use_fails(tmp_path):
    "The notebook check finds an old use planted in a markdown cell, a docstring and a plot label."
    cells = [dict(cell_type='markdown', id='a', metadata={}, source=['The memory keeps $2^{-1/h}$ per token.']),
             dict(cell_type='code', id='b', metadata={}, outputs=[], execution_count=None,
                  source=['def f(x):\n', '    "Concentration c_h of each head."\n', "    return go.Figure(layout=dict(title='k W_O'))\n"]),
             dict(cell_type='markdown', id='c', metadata={}, source=['Keys $k_t$, values $v_t$, concentration $\\kappa_h$.'])]
    nb = tmp_path/'99_planted.ipynb'
    nb.write_text(json.dumps(dict(cells=cells, metadata={}, nbformat=4, nbformat_minor=5)))
    hits = notebook_old_uses(nb)
    assert [h.split(': ')[1] for h in hits] == ['half-life as h', 'concentration or context as c_h', 'gauge factor as k'], hits
    with pytest.raises(AssertionError, match='99_planted.ipynb cell 0'): test_one_symbol_per_quantity(nb)
