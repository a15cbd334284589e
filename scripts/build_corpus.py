"""Build the shipped corpus from the reStructuredText sources of the Python 3.11 docs.

Reproducible: `python scripts/build_corpus.py` fetches Debian's `python3.11-doc` package with
`apt-get download` (or takes `--deb PATH`), splits its documents 90/5/5 by a hash of each
file's path, and writes `taylor_calibrate/data/corpus/{train,valid,test}.jsonl.gz`
(gzip with mtime 0, so the bytes are the same on every run) plus the PSF licence notice.
"""
import argparse, glob, gzip, hashlib, io, json, os, shutil, subprocess, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT/'taylor_calibrate'/'data'/'corpus'
SOURCES = 'usr/share/doc/python3.11/html/_sources'
EXPECTED_DEB = 'python3.11-doc_3.11.2-6+deb12u9_all.deb'

def split_of(path: str) -> str:
    "Deterministic document-level split: 90% train, 5% valid, 5% test by SHA-1 of the path."
    h = int(hashlib.sha1(path.encode()).hexdigest(), 16) % 100
    return 'train' if h < 90 else 'valid' if h < 95 else 'test'

def write_jsonl_gz(rows, fn):
    buf = io.BytesIO()
    with gzip.GzipFile(filename='', mode='wb', fileobj=buf, mtime=0, compresslevel=9) as f:
        for r in rows: f.write((json.dumps(r, ensure_ascii=False) + '\n').encode())
    Path(fn).write_bytes(buf.getvalue())

def main(deb=None):
    with tempfile.TemporaryDirectory() as tmp:
        if deb is None:
            subprocess.run(['apt-get', 'download', 'python3.11-doc'], cwd=tmp, check=True)
            deb = glob.glob(f'{tmp}/python3.11-doc_*.deb')[0]
            if Path(deb).name != EXPECTED_DEB: print(f'warning: got {Path(deb).name}, the shipped files were built from {EXPECTED_DEB}')
        subprocess.run(['dpkg', '-x', deb, f'{tmp}/x'], check=True)
        src = Path(tmp)/'x'/SOURCES
        files = sorted(p.relative_to(src).as_posix() for p in src.rglob('*.rst.txt'))
        splits = {'train': [], 'valid': [], 'test': []}
        for rel in files:
            text = (src/rel).read_text(encoding='utf-8')
            splits[split_of(rel)].append({'path': rel, 'text': text})
        OUT.mkdir(parents=True, exist_ok=True)
        for name, rows in splits.items():
            write_jsonl_gz(rows, OUT/f'{name}.jsonl.gz')
            print(f'{name}: {len(rows)} documents, {sum(len(r["text"]) for r in rows):,} characters')
        shutil.copy(src/'license.rst.txt', OUT/'LICENSE-PSF.txt')

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--deb', help='a python3.11-doc .deb already on disk (default: apt-get download it)')
    main(p.parse_args().deb)
