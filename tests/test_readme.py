"README.md is generated from nbs/index.ipynb (scripts/build_docs.py readme) and must stay in sync."
from conftest import ROOT
import build_docs

def test_readme_in_sync():
    assert (ROOT/'README.md').read_text(encoding='utf-8') == build_docs.readme_text(), \
        'README.md is out of date: run python scripts/build_docs.py readme'

def test_readme_names_the_two_commands():
    txt = (ROOT/'README.md').read_text()
    assert 'pip install -e . && taylor-calibrate demo' in txt
    ci = (ROOT/'.ci'/'run').read_text()
    cmd = 'pip install -e ".[dev]" && nbdev_test && pytest tests/'
    assert cmd in txt and cmd in ci, 'README and .ci/run must run the same test command'

def test_install_demo_and_quick_start_come_before_the_theory():
    txt = (ROOT/'README.md').read_text()
    order = [txt.index(h) for h in ('## Install', '## The demo', '## Quick start in Python', '## Converting a Hugging Face model',
                                    '## The idea in five sentences', '## In one figure')]
    assert order == sorted(order) and txt.index('![') > txt.index('## Quick start in Python')

def test_readme_opens_the_notebooks_and_the_explorer():
    "One line installs what the notebooks need, one opens the explorer; the extra is in settings.ini and setup.py."
    import configparser
    txt = (ROOT/'README.md').read_text()
    assert 'pip install -e ".[notebooks]"\ntaylor-calibrate explore\n' in txt
    cfg = configparser.ConfigParser(delimiters=['=']); cfg.read(ROOT/'settings.ini')
    extra = cfg['DEFAULT']['notebooks_requirements'].split()
    assert {r.split('>')[0].split('<')[0].split('=')[0] for r in extra} >= {'nbdev', 'jupyterlab', 'ipykernel', 'ipywidgets'}
    assert "'notebooks': notebooks_requirements" in (ROOT/'setup.py').read_text()

def test_the_notebooks_need_nothing_beyond_the_install_and_the_notebooks_extra():
    "Every library the notebooks import outside flagged cells (gpu, vllm, ...) comes with the base install or the notebooks extra."
    import configparser, importlib.metadata as md, json, re, sys
    cfg = configparser.ConfigParser(delimiters=['=']); cfg.read(ROOT/'settings.ini')
    flags = cfg['DEFAULT']['tst_flags'].split()
    name = lambda req: re.split(r'[<>=!;\[ ]', req, maxsplit=1)[0].lower().replace('_', '-')
    todo, have = [name(r) for k in ('requirements', 'notebooks_requirements') for r in cfg['DEFAULT'][k].split()], set()
    while todo:                                           # the installed closure of those requirements
        d = todo.pop()
        if d in have: continue
        have.add(d)
        try: reqs = md.requires(d) or []
        except md.PackageNotFoundError: continue
        todo += [name(r) for r in reqs if 'extra ==' not in r]
    provides = {m: {name(d) for d in ds} for m, ds in md.packages_distributions().items()}
    # the package and the repository's own scripts, benches and test helpers (notebooks put their folders on sys.path)
    local = {'taylor_calibrate'} | {p.stem for d in ('scripts', 'bench', 'tests') for p in (ROOT/d).glob('*.py')}
    missing = set()
    for nb in sorted((ROOT/'nbs').rglob('*.ipynb')):
        for c in json.loads(nb.read_text())['cells']:
            src = ''.join(c['source'])
            if c['cell_type'] != 'code' or re.search(r'^#\s*\|\s*(' + '|'.join(flags) + r')\b', src, re.M): continue
            # top-level imports only: one inside a function runs when it is called (fla's kernels on CUDA, vLLM's hooks)
            for m in re.findall(r'^(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))', src, re.M):
                mod = (m[0] or m[1]).split('.')[0]
                if mod in sys.stdlib_module_names or mod in local: continue
                if not provides.get(mod, set()) & have: missing.add(f'{nb.name}: {mod}')
    assert not missing, sorted(missing)

def as_printed(name: str) -> list[str]:
    "A recorded demo's output (bench/results/NAME) as `taylor-calibrate demo` without --out prints it: the same lines, the default folder."
    from taylor_calibrate.cli import build_parser
    lines = (ROOT/'bench'/'results'/name).read_text().splitlines()
    recorded, default = lines[0].split('--out ', 1)[1].split()[0], build_parser().parse_args(['demo']).out
    out = [l for l in lines if not l.startswith(('$', '#'))]
    assert out[-2].startswith(f'best: taylor+; writing {recorded}/ (')
    return out[:-2] + [out[-2].replace(f'writing {recorded}/', f'writing {default}/'), out[-1]]

def test_the_demo_output_in_readme_is_what_the_command_line_prints(monkeypatch):
    "README's demo output is bench/results/demo_output.txt's as the command README gives prints it: its first two lines in the CLI's form, the folder it writes the default one."
    from taylor_calibrate.cli import _teacher_origin, choose_threads
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    import re
    out = as_printed('demo_output.txt')
    section = (ROOT/'README.md').read_text().split('## The demo', 1)[1].split('\n## ', 1)[0]
    blocks = re.findall(r'```(\w*)\n(.*?)```', section, re.S)
    assert blocks[0] == ('sh', 'pip install -e . && taylor-calibrate demo\n') and blocks[1][0] == ''
    assert blocks[1][1].splitlines() == out
    assert out[0] == f'teacher: tiny-qwen2 ({_teacher_origin(None)}; qwen2, 8 layers); keep uniform:0.25; evaluating on 32,768 test tokens'
    assert out[1] == f'threads: 1 ({choose_threads("auto", None)[1]})'
    assert out[-2].startswith('best: taylor+; writing taylor-calibrate-demo/ (') and 'HTML report to `taylor-calibrate-demo/`' in section

def test_the_real_teacher_demo_in_readme_is_what_the_command_line_printed():
    "README's real-teacher demo output is bench/results/demo_output_smollm2-135m.txt's as the command README gives prints it."
    import re
    from taylor_calibrate.cli import _teacher_origin
    out = as_printed('demo_output_smollm2-135m.txt')
    section = (ROOT/'README.md').read_text().split('### On a real model', 1)[1].split('\n## ', 1)[0]
    blocks = re.findall(r'```(\w*)\n(.*?)```', section, re.S)
    assert blocks[0] == ('sh', 'taylor-calibrate demo --teacher smollm2-135m\n') and blocks[1][0] == ''
    from taylor_calibrate.teacher import CACHE_ENV, DEFAULT_CACHE
    assert f'`{DEFAULT_CACHE}`' in section and f'set `{CACHE_ENV}` to another folder' in section   # where the fetched teacher is kept
    assert blocks[1][1].splitlines() == out
    assert out[0].startswith(f'teacher: smollm2-135m ({_teacher_origin("smollm2-135m")}; llama, 30 layers); keep uniform:0.25')
    assert re.fullmatch(r'threads: [12] \(--threads auto: 2 CPU cores, [01] of them busy when the command started \(load average \d\.\d\d\)\)', out[1])
    from taylor_calibrate.cli import build_parser
    inits = build_parser().parse_args(['demo']).inits.split(',')
    assert [l.split()[0] for l in out[2:3 + len(inits)]] == ['teacher', *inits]      # the demo's default inits
    seconds = int(re.fullmatch(r'done in (\d+)s', out[-1])[1])
    assert f'{seconds / 60:.0f} minutes' in ' '.join(section.split())

def test_the_quick_start_is_what_bench_threads_measures():
    "bench/threads.py runs README's Quick start as it stands; its variants change the thread line and nothing else."
    import sys
    sys.path.insert(0, str(ROOT/'bench'))
    import threads
    code = threads.quickstart_code()
    assert 'torch.set_num_threads(1)' in code and 'perplexity(student, tok, "test")' in code
    v = threads.quickstart_variants(code, reduced=False)
    assert v['readme'].startswith(code) and 'set_num_threads' not in v['torch_default'].split('import torch as _t')[0]
