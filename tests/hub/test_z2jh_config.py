"""The course on Kubernetes (config/z2jh/, docs/z2jh.md), checked without a cluster, helm or network: the values
parse and their hub.extraConfig runs as the chart runs it (against a traitlets Config, with z2jh's get_config); each
role's server gets the Jupyter config of config/hub/<role> and its exchange mounts, at the exchange root the course's
nbgrader config reads; the image installs requirements.txt and nothing else with a version, from pinned bases, set up
as `make setup` sets up .venv, without the hidden tests; versions and the chart release agree everywhere."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from autograder.hub.classroom import CONFIG_DIR, COURSE_ID, role_env
from autograder.paths import REPO_ROOT

Z2JH = REPO_ROOT / "config" / "z2jh"
HOME = "/home/jovyan"
EXCHANGE_FOLDERS = {"inbound": False, "outbound": True, "feedback": True}     # folder -> read-only for a student


def requirements() -> dict[str, str]:
    pins = {}
    for line in (REPO_ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    return pins


def values() -> dict:
    return yaml.safe_load((Z2JH / "values.yaml").read_text())


def chart_version() -> str:
    found = re.search(r"^# chart: jupyterhub (\S+)", (Z2JH / "values.yaml").read_text(), re.MULTILINE)
    assert found, "values.yaml's header names no chart release (`# chart: jupyterhub X.Y.Z`)"
    return found.group(1)


# ----------------------------------------------------------------------------- the Dockerfile, read as Docker does

def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each instruction: continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending.strip():
            keyword, _, args = pending.strip().partition(" ")
            out.append((keyword.upper(), " ".join(args.split())))
        pending = ""
    return out


def stages(text: str) -> dict[str, dict]:
    """Each build stage by alias: its base image and its instructions."""
    found: dict[str, dict] = {}
    current = None
    for keyword, args in instructions(text):
        if keyword == "FROM":
            base, _, alias = args.partition(" AS ")
            current = {"base": base.strip(), "steps": []}
            found[alias.strip() or base.strip()] = current
        elif current is not None:
            current["steps"].append((keyword, args))
    return found


def commands(steps: list[tuple[str, str]]) -> list[str]:
    """The shell commands of the RUN steps, one per `&&`-joined part."""
    return [part.strip() for keyword, args in steps if keyword == "RUN" for part in args.split("&&")]


def dockerfile() -> dict[str, dict]:
    return stages((Z2JH / "Dockerfile").read_text())


# ----------------------------------------------------------------------------- hub.extraConfig, run as the chart does

def z2jh_get_config(config: dict):
    """The chart's z2jh.get_config: a dotted key into the values, the default where it is missing or null."""
    def get_config(key: str, default=None):
        node = config
        for part in key.split("."):
            if not isinstance(node, dict) or node.get(part) is None:
                return default
            node = node[part]
        return node
    return get_config


def run_extra_config(config: dict, replace: dict[str, str] | None = None) -> Config:
    """What the chart's jupyterhub_config.py does before and with hub.extraConfig (4.4.0: the singleuser environment
    and volume mounts as dicts, then each extraConfig entry exec'd in order of its key)."""
    c = Config()
    c.KubeSpawner.environment = dict(config["singleuser"]["extraEnv"])
    home = config["singleuser"]["storage"]["homeMountPath"]
    c.KubeSpawner.volume_mounts = {"volume-{user_server}": {"name": "volume-{user_server}", "mountPath": home,
                                                            "subPath": None}}
    c.Spawner.cmd = config["singleuser"]["cmd"]
    namespace = {"c": c, "get_config": z2jh_get_config(config)}
    for key, code in sorted(config["hub"]["extraConfig"].items()):
        for old, new in (replace or {}).items():
            assert old in code, f"{old!r} is not in hub.extraConfig.{key}"
            code = code.replace(old, new)
        exec(compile(code, f"hub.extraConfig.{key}", "exec"), namespace)  # noqa: S102  (as the chart does)
    return c


def spawn(c: Config, *, admin: bool) -> SimpleNamespace:
    """A stand-in for the KubeSpawner of one user, as configured by `c`, after the pre_spawn_hook."""
    spawner = SimpleNamespace(user=SimpleNamespace(name="someone", admin=admin),
                              environment=dict(c.KubeSpawner.environment), extra_labels={},
                              volume_mounts=dict(c.KubeSpawner.volume_mounts), notebook_dir="",
                              cmd=[c.Spawner.cmd], container_security_context={}, extra_pod_config={})
    c.KubeSpawner.pre_spawn_hook(spawner)
    return spawner


def exchange_mounts(spawner: SimpleNamespace) -> list[dict]:
    return [m for m in spawner.volume_mounts.values() if m["name"] == "nbgrader-exchange"]


def course_dir() -> str:
    """The course folder of the image, as its Dockerfile makes it (WORKDIR of the course stage)."""
    workdirs = [args for keyword, args in dockerfile()["course"]["steps"] if keyword == "WORKDIR"]
    return workdirs[0]


def jupyter_settings(config_path: str) -> tuple[dict, dict]:
    """Server extensions and JupyterLab's disabled plugins that a JUPYTER_CONFIG_PATH gives, read from this
    repository's copy of the image's folders (first folder wins, as in Jupyter)."""
    served, disabled = {}, {}
    for folder in reversed(config_path.split(":")):
        local = Path(folder.replace(course_dir(), str(REPO_ROOT), 1))
        assert local.is_dir(), f"{folder} on JUPYTER_CONFIG_PATH is not a folder of the course ({local})"
        server = local / "jupyter_server_config.json"
        if server.exists():
            served.update(json.loads(server.read_text())["ServerApp"]["jpserver_extensions"])
        page = local / "labconfig" / "page_config.json"
        if page.exists():
            disabled.update(json.loads(page.read_text())["disabledExtensions"])
    return served, disabled


# ----------------------------------------------------------------------------- values and the chart

def test_values_parse_and_name_one_chart_release_everywhere() -> None:
    config, chart = values(), chart_version()
    assert {"hub", "singleuser", "cull"} <= set(config)
    hub_base = dockerfile()["hub"]["base"]
    assert hub_base == f"quay.io/jupyterhub/k8s-hub:{chart}", (
        f"the hub image is built on {hub_base}, but values.yaml is for chart {chart}")
    doc = (REPO_ROOT / "docs" / "z2jh.md").read_text()
    assert set(re.findall(r"--version (\d\S*)", doc)) == {chart}, "docs/z2jh.md installs another chart release"
    assert set(re.findall(r"--version (\d\S*)", (Z2JH / "values.yaml").read_text())) == {chart}


def test_hub_and_servers_run_the_jupyterhub_and_nbgrader_of_requirements() -> None:
    pins, config = requirements(), values()
    assert config["hub"]["image"]["tag"] == f"{chart_version()}-jupyterhub-{pins['jupyterhub']}"
    files = (Z2JH / "values.yaml", Z2JH / "Dockerfile", REPO_ROOT / "docs" / "z2jh.md")
    texts = {p.name: p.read_text() for p in files}
    for name, text in texts.items():
        for package, version in re.findall(r"\b(jupyterhub|nbgrader)(?:==|-)(\d+\.\d+\.\d+)", text, re.IGNORECASE):
            pinned = pins[package.lower()]
            assert version == pinned, f"{name} names {package} {version}, requirements.txt pins {pinned}"
    doc = texts["z2jh.md"]
    assert f"nbgrader {pins['nbgrader']}" in doc and f"JupyterHub {pins['jupyterhub']}" in doc


def test_extra_config_runs_against_a_traitlets_config_and_sets_the_role_hook() -> None:
    c = run_extra_config(values())
    assert callable(c.KubeSpawner.pre_spawn_hook) and c.KubeSpawner.pre_spawn_hook.__name__ == "course_role"


# ----------------------------------------------------------------------------- roles, as on the one-machine hub

@pytest.mark.parametrize("role", ["student", "instructor"])
def test_each_role_gets_the_jupyter_config_of_config_hub(role: str) -> None:
    spawner = spawn(run_extra_config(values()), admin=role == "instructor")
    config_path = spawner.environment["JUPYTER_CONFIG_PATH"]
    on_one_machine = role_env("/venv", role, "/exchange")["JUPYTER_CONFIG_PATH"]
    assert config_path.replace(course_dir(), str(REPO_ROOT)) == on_one_machine
    assert spawner.extra_labels["llm-course/role"] == role
    copies = [args.split() for keyword, args in dockerfile()["course"]["steps"] if keyword == "COPY"]
    assert ["config", "config"] in copies, "the image must hold config/ as it is (the role folders among it)"
    assert CONFIG_DIR == REPO_ROOT / "config" / "hub"


def test_students_get_the_assignments_tab_and_not_the_formgrader() -> None:
    spawner = spawn(run_extra_config(values()), admin=False)
    served, disabled = jupyter_settings(spawner.environment["JUPYTER_CONFIG_PATH"])
    assert served["nbgrader.server_extensions.assignment_list"] and not served["nbgrader.server_extensions.formgrader"]
    assert not served["nbgrader.server_extensions.course_list"]
    assert disabled["@jupyter/nbgrader:formgrader"] and disabled["@jupyter/nbgrader:create-assignment"]
    assert not disabled["@jupyter/nbgrader:assignment-list"]
    assert spawner.notebook_dir == "" and spawner.cmd == ["jupyterhub-singleuser"], "a student works at home"


def test_the_instructor_gets_the_formgrader_in_the_course_folder() -> None:
    spawner = spawn(run_extra_config(values()), admin=True)
    served, disabled = jupyter_settings(spawner.environment["JUPYTER_CONFIG_PATH"])
    assert all(served.values()) and not any(disabled.values())
    assert spawner.notebook_dir == f"{HOME}/course"
    script = spawner.cmd[2]
    assert spawner.cmd[:2] == ["sh", "-c"] and 'cd "$HOME/course"' in script
    assert spawner.cmd[3] == "jupyterhub-singleuser"


# ----------------------------------------------------------------------------- the exchange

def nbgrader_exchange_root(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """Exchange.root and course id of config/hub/common/nbgrader_config.py, in a server's environment."""
    for name, value in values()["singleuser"]["extraEnv"].items():
        monkeypatch.setenv(name, value)
    loaded = PyFileConfigLoader("nbgrader_config.py", path=str(CONFIG_DIR / "common")).load_config()
    return loaded.Exchange.root, loaded.CourseDirectory.course_id


def test_the_instructor_mounts_the_exchange_at_nbgraders_exchange_root(monkeypatch: pytest.MonkeyPatch) -> None:
    root, course_id = nbgrader_exchange_root(monkeypatch)
    assert course_id == COURSE_ID
    mounts = exchange_mounts(spawn(run_extra_config(values()), admin=True))
    assert mounts == [{"name": "nbgrader-exchange", "mountPath": root}]
    volumes = {v["name"]: v for v in values()["singleuser"]["storage"]["extraVolumes"]}
    assert volumes["nbgrader-exchange"]["persistentVolumeClaim"]["claimName"] == "llm-course-exchange"


def test_a_student_may_write_the_inbound_folder_only(monkeypatch: pytest.MonkeyPatch) -> None:
    root, course_id = nbgrader_exchange_root(monkeypatch)
    mounts = exchange_mounts(spawn(run_extra_config(values()), admin=False))
    got = {m["subPath"]: (m["mountPath"], m["readOnly"]) for m in mounts}
    assert got == {f"{course_id}/{folder}": (f"{root}/{course_id}/{folder}", read_only)
                   for folder, read_only in EXCHANGE_FOLDERS.items()}


def test_the_image_makes_the_exchange_root_writable(monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = nbgrader_exchange_root(monkeypatch)
    run = commands(dockerfile()["course"]["steps"])
    assert f"mkdir -p {root}" in run and f"chmod 1777 {root}" in run, (
        f"nbgrader needs its exchange root {root} writable in a student's server, where only its folders are mounted")


def test_the_sandbox_settings_reach_the_instructors_server_only_when_asked() -> None:
    plain = run_extra_config(values())
    assert spawn(plain, admin=True).container_security_context == {}
    asked = run_extra_config(values(), {"GRADE_FROM_INSTRUCTOR_SERVER = False": "GRADE_FROM_INSTRUCTOR_SERVER = True"})
    instructor, student = spawn(asked, admin=True), spawn(asked, admin=False)
    assert instructor.container_security_context["procMount"] == "Unmasked"
    assert instructor.container_security_context["seccompProfile"] == {"type": "Unconfined"}
    assert instructor.extra_pod_config["hostUsers"] is False
    assert student.container_security_context == {} and student.extra_pod_config == {}


# ----------------------------------------------------------------------------- limits per student, culling

def quantity(text: str | float) -> float:
    """A Kubernetes quantity (2G, 512Mi, 0.5) as a number."""
    units = {"K": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    found = re.fullmatch(r"([\d.]+)([KMG]i?)?", str(text))
    assert found, f"not a quantity: {text}"
    return float(found.group(1)) * units.get(found.group(2) or "", 1)


def test_each_student_gets_the_one_machine_hubs_memory_and_environment() -> None:
    single = values()["singleuser"]
    hub_config = (REPO_ROOT / "config" / "hub" / "jupyterhub_config.py").read_text()
    one_machine = re.search(r'"LLM_COURSE_MEM_LIMIT", "([^"]+)"', hub_config).group(1)
    assert quantity(single["memory"]["limit"]) == quantity(one_machine)
    for what in ("memory", "cpu"):
        assert quantity(single[what]["guarantee"]) <= quantity(single[what]["limit"])
    expected = role_env("/venv", "student", single["extraEnv"]["LLM_COURSE_EXCHANGE"])
    for name in ("LLM_COURSE_EXCHANGE", "LLM_COURSE_ID", "OMP_NUM_THREADS"):
        assert single["extraEnv"][name] == expected[name]
    spawner_source = (REPO_ROOT / "autograder" / "hub" / "spawner.py").read_text()
    assert f'MPLBACKEND="{single["extraEnv"]["MPLBACKEND"]}"' in spawner_source


def test_idle_servers_are_culled_but_not_the_instructors() -> None:
    cull = values()["cull"]
    assert cull["enabled"] and 0 < cull["timeout"] and cull["adminUsers"] is False and cull["users"] is False


def test_the_image_runs_servers_as_the_charts_user() -> None:
    single = values()["singleuser"]
    users = [cmd for cmd in commands(dockerfile()["course"]["steps"]) if cmd.startswith("useradd")]
    assert len(users) == 1
    argv = shlex.split(users[0])
    assert argv[argv.index("--uid") + 1] == str(single["uid"]) and argv[argv.index("--gid") + 1] == str(single["fsGid"])
    assert argv[-1] == "jovyan" and single["storage"]["homeMountPath"] == HOME


# ----------------------------------------------------------------------------- the image

def test_base_images_are_pinned_by_tag() -> None:
    built = dockerfile()
    for alias, stage in built.items():
        base = stage["base"]
        if base in built:
            continue
        name, _, tag = base.rpartition(":")
        assert "@sha256:" in base or (name and "/" not in tag and tag != "latest" and re.search(r"\d", tag)), (
            f"stage {alias} starts from {base}: pin it by a version tag")


def test_the_image_installs_requirements_txt_and_no_other_version() -> None:
    text, pins = (Z2JH / "Dockerfile").read_text(), requirements()
    code = "\n".join(f"{k} {a}" for k, a in instructions(text))
    assert not re.search(r"[A-Za-z0-9_.\-\]]+\s*(==|>=|<=|~=)\s*\d", code), "a version outside requirements.txt"
    course = dockerfile()["course"]
    copied = [args.split()[:-1] for keyword, args in course["steps"] if keyword == "COPY"]
    assert any("requirements.txt" in sources for sources in copied)
    installs = [cmd for stage in dockerfile().values() for cmd in commands(stage["steps"]) if "pip install" in cmd]
    assert any(cmd.endswith("pip install --no-cache-dir -r requirements.txt") for cmd in commands(course["steps"]))
    for cmd in installs:
        argv = shlex.split(cmd)
        rest = [a for a in argv[argv.index("install") + 1:] if a != "--no-cache-dir"]
        if rest in (["-r", "requirements.txt"], ["-e", ".", "--no-deps"]):
            continue
        assert rest[0] == "--constraint" and rest[1].endswith("requirements.txt"), f"unpinned install: {cmd}"
        assert set(rest[2:]) <= set(pins), f"installs what requirements.txt does not pin: {cmd}"


def makefile_setup() -> list[str]:
    """The commands of the Makefile's `$(STAMP):` recipe (make setup), its variables expanded."""
    text = (REPO_ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^([A-Z0-9_]+)\s*[:?]?=\s*(.*?)\s*$", text, re.MULTILINE))
    recipe = re.search(r"^\$\(STAMP\):.*\n((?:\t.*\n)+)", text, re.MULTILINE).group(1)
    joined = re.sub(r"\\\n\t\s*", " ", recipe)

    def expand(line: str) -> str:
        for _ in range(4):
            line = re.sub(r"\$\(([A-Z0-9_]+)\)", lambda m: variables.get(m.group(1), m.group(0)), line)
        return line
    lines = [line.strip().lstrip("@") for line in joined.splitlines()]
    return [expand(line) for line in lines if line and not line.startswith("#")]     # a recipe's comments: no command


def normalized(command: str) -> str:
    """A setup command with what differs between the Makefile and the image taken out: the venv's bin/ prefix
    (it is first on the image's PATH), python3 for python, pip's cache flag, a `test ... ||` guard and the
    `|| { echo ...; exit 1; }` message after a check."""
    parts = [p.strip() for p in command.split("||") if not p.strip().startswith(("test ", "{"))]
    command = parts[0] if parts else ""
    command = re.sub(r"^python3 ", "python ", re.sub(r"(\S*/)?\.venv/bin/", "", command)).replace(" --no-cache-dir", "")
    return " ".join(command.split())


def test_the_image_is_set_up_as_make_setup_sets_up_the_venv() -> None:
    in_image = {normalized(cmd) for cmd in commands(dockerfile()["course"]["steps"])}
    steps = [normalized(part) for line in makefile_setup() if not line.startswith("touch ")
             for part in line.split("&&")]
    assert len(steps) >= 8
    missing = [step for step in steps if step and step not in in_image]
    assert not missing, f"make setup does what the image does not: {missing}"


def test_the_image_leaves_out_the_hidden_tests_and_instructor_outputs() -> None:
    course = dockerfile()["course"]
    sources = [src for keyword, args in course["steps"] if keyword == "COPY" for src in args.split()[:-1]]
    assert "." not in sources and "./" not in sources, "copying the whole context brings solutions/ along"
    private = {"solutions", "submitted", "autograded", "feedback", "gradebook.db", ".venv", "workspace"}
    assert not private & {src.strip("/").split("/")[0] for src in sources}
    assert {"shared", "autograder", "data", "config", "nbgrader_config.py"} <= set(sources)


def test_the_hub_hook_and_the_image_agree_on_the_course_folder() -> None:
    code = values()["hub"]["extraConfig"]["course-roles"]
    assert f'COURSE_DIR = "{course_dir()}"' in code
    env = [args for keyword, args in dockerfile()["course"]["steps"] if keyword == "ENV" and args.startswith("PATH=")]
    assert env == [f"PATH={course_dir()}/.venv/bin:$PATH"]
