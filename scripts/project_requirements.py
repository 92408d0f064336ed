"""Print pyproject.toml's requirements one per line, torch left out (setup installs torch itself
and never hands it to pip's resolver again).

    project_requirements.py test     the dependencies and the `test` extra
    project_requirements.py --extra gpu   the `gpu` extra alone
"""

import re
import sys
import tomllib
from pathlib import Path

project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
extras = project["optional-dependencies"]
args = sys.argv[1:]
if args[:1] == ["--extra"]:
    wanted = [requirement for name in args[1:] for requirement in extras[name]]
else:
    wanted = list(project["dependencies"]) + [requirement for name in args for requirement in extras[name]]
for requirement in wanted:
    if re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower() != "torch":
        print(requirement)
