"""mkdocs hook: the committed results (results/, benchmarks/results/) are part of the site.

The docs link the experiments' reports and show their plots where they live in the repository, so that no figure or
table is copied into docs/: this adds those folders' files to the site under their repository paths
(``results/default/ppl_ratio.png``), where mkdocs checks every link to them like any other (``--strict`` fails on one
that points nowhere).
"""

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("results", "benchmarks/results")


def on_files(files, config):
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file():
                uri = path.relative_to(ROOT).as_posix()
                files.append(File(uri, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
