"""Package metadata, read from settings.ini (nbdev 2 layout); no pkg_resources."""
from configparser import ConfigParser
import setuptools

cfg = ConfigParser(delimiters=['='])
cfg.read('settings.ini', encoding='utf-8')
cfg = cfg['DEFAULT']

licenses = {'apache2': ('Apache Software License 2.0', 'OSI Approved :: Apache Software License')}
statuses = ['1 - Planning', '2 - Pre-Alpha', '3 - Alpha', '4 - Beta', '5 - Production/Stable', '6 - Mature', '7 - Inactive']
lic = licenses[cfg['license']]
min_python = cfg['min_python']
py_versions = ['3.10', '3.11', '3.12', '3.13']

requirements = cfg.get('requirements', '').split()
dev_requirements = cfg.get('dev_requirements', '').split()
cuda_requirements = cfg.get('cuda_requirements', '').split()   # fla's Triton kernels, for CUDA machines
notebooks_requirements = cfg.get('notebooks_requirements', '').split()   # the notebooks in JupyterLab, and `taylor-calibrate explore`
serve_requirements = cfg.get('serve_requirements', '').split()   # empty: the vLLM plugin, beside an installed vLLM
package_data = {cfg['lib_name']: cfg.get('package_data', '').split()}

setuptools.setup(
    name=cfg['lib_name'].replace('_', '-'),
    version=cfg['version'],
    license=lic[0],
    classifiers=[
        'Development Status :: ' + statuses[int(cfg['status'])],
        'Intended Audience :: ' + cfg['audience'].title(),
        'License :: ' + lic[1],
        'Natural Language :: ' + cfg['language'].title(),
    ] + ['Programming Language :: Python :: ' + o for o in py_versions[py_versions.index(min_python):]],
    url=cfg['git_url'],
    packages=setuptools.find_packages(include=[cfg['lib_name'], cfg['lib_name'] + '.*']),
    package_data=package_data,
    include_package_data=True,
    install_requires=requirements,
    extras_require={'dev': dev_requirements, 'cuda': cuda_requirements, 'serve': serve_requirements, 'notebooks': notebooks_requirements},
    python_requires='>=' + min_python,
    description=cfg['description'],
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    zip_safe=False,
    entry_points={
        'console_scripts': cfg.get('console_scripts', '').split(),
        'nbdev': [f"{cfg['lib_name']}={cfg['lib_name']}._modidx:d"],
        # vLLM calls this in each of its processes: saved hybrids served by `vllm serve` (nbs/83_vllm_plugin.ipynb)
        'vllm.general_plugins': [f"{cfg['lib_name']}={cfg['lib_name']}.vllm_plugin:register"],
    },
)
