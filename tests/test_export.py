"The exported modules must be what nbdev_export makes of the notebooks (catches a forgotten export)."
import shutil, subprocess, sys
from pathlib import Path
from conftest import ROOT

def test_exported_modules_match_notebooks(tmp_path):
    for name in ('settings.ini', 'nbs', 'taylor_calibrate'):
        src = ROOT/name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path/name)
    exe = Path(sys.executable).with_name('nbdev_export')
    subprocess.run([str(exe)], cwd=tmp_path, check=True, capture_output=True)
    stale = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT/'taylor_calibrate').rglob('*.py'))
             if p.read_text() != (tmp_path/p.relative_to(ROOT)).read_text()]
    new = [p.relative_to(tmp_path).as_posix() for p in sorted((tmp_path/'taylor_calibrate').rglob('*.py'))
           if not (ROOT/p.relative_to(tmp_path)).exists()]
    assert not stale and not new, f'run nbdev_export: out of date {stale}, missing {new}'

def test_every_export_has_a_docstring():
    import ast
    missing = []
    for p in sorted((ROOT/'taylor_calibrate').glob('*.py')):
        if p.name.startswith('_'): continue
        tree = ast.parse(p.read_text())
        names = set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, 'id', None) == '__all__' for t in node.targets):
                names = {e.value for e in node.value.elts}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names and not ast.get_docstring(node):
                missing.append(f'{p.name}:{node.name}')
    assert not missing, f'exported without a docstring: {missing}'

def test_notebooks_are_clean(tmp_path):
    "nbdev_clean must leave the committed notebooks unchanged (no stray metadata or execution counts; their text outputs stay)."
    shutil.copy(ROOT/'settings.ini', tmp_path/'settings.ini')
    shutil.copytree(ROOT/'nbs', tmp_path/'nbs')
    exe = Path(sys.executable).with_name('nbdev_clean')
    subprocess.run([str(exe)], cwd=tmp_path, check=True, capture_output=True)
    dirty = [p.name for p in sorted((ROOT/'nbs').glob('*.ipynb')) if p.read_text() != (tmp_path/'nbs'/p.name).read_text()]
    assert not dirty, f'run nbdev_clean: {dirty}'
