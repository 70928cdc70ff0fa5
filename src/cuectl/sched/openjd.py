"""Open Job Description job templates (``specificationVersion: jobtemplate-2023-09``) as job specs.

The template is validated and instantiated by the ``openjd-model`` package (the optional
extra ``cuectl[openjd]``), then mapped onto the mapping that :func:`cuectl.sched.spec.spec_from_mapping`
validates, so an imported template gets exactly the checks a native spec gets. What cannot
be expressed in cuectl is reported as a note (``cuectl submit`` prints each as a ``warning:``
line); what would make the command wrong is an error. docs/openjd.md has the mapping.

Only this module imports ``openjd.model``, and only when a template is converted.
"""

from __future__ import annotations

import math
import re
import shlex
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterable, Mapping

from cuectl.errors import InvalidInput

EXTRA = "openjd"
INSTALL_HINT = "pip install 'cuectl[openjd]' (or: pip install openjd-model)"

_LAYER_NAME_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
# Private-use markers for values that only exist where the frame runs (embedded files, the
# session directory): replaced after format strings are resolved, never seen by a user.
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"
_MARK_RE = re.compile(f"{_MARK_OPEN}([^{_MARK_CLOSE}]*){_MARK_CLOSE}")
_SESSION_DIR = "session"

# hostRequirements amounts cuectl reserves (OpenJD units: MiB for memory).
_GPU, _GPU_MEMORY, _VCPU, _MEMORY = (
    "amount.worker.gpu",
    "amount.worker.gpu.memory",
    "amount.worker.vcpu",
    "amount.worker.memory",
)
# GPU attributes the 2023-09 schema does not define (and its validator refuses under the
# reserved attr.worker.*): cuectl reads these farm-defined names, with any vendor prefix
# (``cuectl:attr.gpu.model``), as GPU constraints (docs/openjd.md).
_GPU_MODEL_ATTRS = ("attr.gpu.model",)
_GPU_VENDOR_ATTRS = ("attr.gpu.vendor",)
# Farm-defined amounts (any vendor prefix, as the attributes) whose min is a per-device
# version minimum: its decimal as written (8.9, 12.2, 550), compared as versions.
_GPU_VERSION_AMOUNTS = {
    "amount.gpu.compute_capability": "gpu_capability_min",
    "amount.gpu.driver": "gpu_driver_min",
    "amount.gpu.cuda": "gpu_cuda_min",
}


def is_openjd(data: Any) -> bool:
    """A parsed document is an Open Job Description template: a mapping with
    ``specificationVersion`` (``jobtemplate-2023-09``; any other value is refused by the
    validator with its own message, rather than as an unknown cuectl key)."""
    return isinstance(data, Mapping) and "specificationVersion" in data


def _one_line(text: str) -> str:
    """The validator's message (pydantic's, several lines) as one line."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    if lines and re.fullmatch(r"\d+ validation errors? for \w+", lines[0]):
        lines = lines[1:]
    parts: list[str] = []
    for ln in lines:
        if parts and parts[-1].endswith(":"):
            parts[-1] = f"{parts[-1]} {ln}"
        else:
            parts.append(ln)
    return "; ".join(parts) or "invalid template"


def _import_model() -> Any:
    try:
        import openjd.model as model  # noqa: PLC0415 - optional extra, imported only here
    except ImportError:
        raise InvalidInput(
            "an Open Job Description template needs the openjd-model package, which is not installed",
            hint=f"install the '{EXTRA}' extra: {INSTALL_HINT}",
        ) from None
    return model


def _parse_params(items: Mapping[str, str] | Iterable[str]) -> dict[str, str]:
    if isinstance(items, Mapping):
        return {str(k): str(v) for k, v in items.items()}
    values: dict[str, str] = {}
    for item in items:
        name, sep, value = str(item).partition("=")
        if not sep or not name:
            raise InvalidInput(f"--param: expected NAME=VALUE, got {item!r}")
        values[name] = value
    return values


def _number(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


class _Resolver:
    """Resolves a step's format strings: job parameters to their values, the task's
    parameters to cuectl tokens (or to one task's values), files and the session directory
    to markers that the command builder turns into paths under the frame's temporary
    directory."""

    def __init__(self, model: Any, job_symbols: Mapping[str, str], step_name: str) -> None:
        self.model = model
        self.base = {**job_symbols, "Step.Name": step_name}

    def resolve(self, text: Any, task: Mapping[str, str], files: Iterable[str], where: str) -> str:
        if not hasattr(text, "resolve"):
            return str(text)
        table = dict(self.base)
        table.update(task)
        for name in files:
            table[f"Task.File.{name}"] = f"{_MARK_OPEN}file:{name}{_MARK_CLOSE}"
        table["Session.WorkingDirectory"] = f"{_MARK_OPEN}{_SESSION_DIR}{_MARK_CLOSE}"
        table["Session.HasPathMappingRules"] = "false"
        try:
            return str(text.resolve(symtab=self.model.SymbolTable(source=table)))
        except self.model.FormatStringError as exc:
            raise InvalidInput(
                f"{where}: cannot be imported: {_one_line(str(exc))}",
                hint="cuectl resolves job parameters, the task's parameters, Task.File.* and "
                "Session.WorkingDirectory (docs/openjd.md)",
            ) from None


def _frame_range(definition: Any) -> str | None:
    """A single INT task parameter's values as a cuectl frame range, or None."""
    rng = definition.range
    if hasattr(rng, "ranges"):  # IntRangeExpr: sorted sections with positive steps
        sections = []
        for part in rng.ranges:
            if part.start == part.end:
                sections.append(str(part.start))
            elif part.step == 1:
                sections.append(f"{part.start}-{part.end}")
            else:
                sections.append(f"{part.start}-{part.end}x{part.step}")
        return ",".join(sections)
    values = [int(v) for v in rng]
    if len(set(values)) != len(values):
        return None  # repeated values: one frame per task keeps each task
    return ",".join(str(v) for v in values)


def _layer_names(steps: Iterable[Any], notes: list[str]) -> dict[str, str]:
    names: dict[str, str] = {}
    used: set[str] = set()
    for step in steps:
        original = str(step.name)
        name = _LAYER_NAME_BAD.sub("_", original).strip("_")[:100] or "step"
        base, n = name, 2
        while name.lower() in used:
            name = f"{base[:96]}_{n}"
            n += 1
        used.add(name.lower())
        if name != original:
            notes.append(f"step '{original}': layer named '{name}' (layer names are [A-Za-z0-9_.-])")
        names[original] = name
    return names


def _host_requirements(step: Any, layer: dict[str, Any], where: str, notes: list[str]) -> None:
    req = step.hostRequirements
    if req is None:
        return
    for amount in req.amounts or []:
        name = str(amount.name).lower()
        low, high = _number(amount.min), _number(amount.max)
        if name == _GPU:
            layer["gpus"] = int(math.ceil(low or 0))
            if high is not None:
                notes.append(
                    f"{where}: {amount.name} max {high:g} not honoured: each frame gets exactly {layer['gpus']} GPU(s)"
                )
        elif name == _GPU_MEMORY:
            if low:
                layer["gpu_memory_min"] = str(int(math.ceil(low)))  # a bare number is MiB
            if high is not None:
                notes.append(f"{where}: {amount.name} max not honoured (cuectl has no upper bound on GPU memory)")
        elif name == _VCPU:
            if low:
                layer["cores"] = max(low, 0.1)
            if high is not None:
                notes.append(f"{where}: {amount.name} max not honoured: each frame reserves {low or 1:g} core(s)")
        elif name == _MEMORY:
            if low:
                layer["memory"] = str(int(math.ceil(low)))  # MiB
            if high is not None:
                notes.append(f"{where}: {amount.name} max not honoured (cuectl reserves the minimum)")
        elif name.split(":", 1)[-1] in _GPU_VERSION_AMOUNTS:
            key = _GPU_VERSION_AMOUNTS[name.split(":", 1)[-1]]
            if amount.min is not None:
                layer[key] = str(amount.min)  # the Decimal's own text: 8.10 stays 8.10
            if high is not None:
                notes.append(f"{where}: {amount.name} max not honoured (cuectl has no upper bound on versions)")
        else:
            notes.append(f"{where}: host requirement {amount.name} not honoured (cuectl does not track it)")
    if any(key in layer for key in _GPU_VERSION_AMOUNTS.values()) and not layer.get("gpus"):
        layer["gpus"] = 1
        notes.append(f"{where}: a GPU version minimum without {_GPU}: asks for 1 GPU")
    if layer.get("gpu_memory_min") and not layer.get("gpus"):
        layer["gpus"] = 1
        notes.append(f"{where}: {_GPU_MEMORY} without {_GPU}: asks for 1 GPU")
    elif layer.get("gpu_memory_min") and layer.get("gpus", 0) > 1:
        notes.append(
            f"{where}: {_GPU_MEMORY} is required of each of the {layer['gpus']} GPUs (cuectl never "
            "adds memory across devices)"
        )
    for attribute in req.attributes or []:
        name = str(attribute.name).lower().split(":", 1)[-1]
        any_of = [str(v) for v in attribute.anyOf or []]
        all_of = [str(v) for v in attribute.allOf or []]
        if name in _GPU_MODEL_ATTRS and (any_of and not all_of or len(all_of) == 1 and not any_of):
            layer["gpu_models"] = any_of or all_of
        elif name in _GPU_VENDOR_ATTRS and len(any_of or all_of) == 1 and not (any_of and all_of):
            layer["gpu_vendor"] = (any_of or all_of)[0]
        else:
            notes.append(f"{where}: host requirement {attribute.name} not honoured (cuectl does not match hosts by it)")
    if (layer.get("gpu_models") or layer.get("gpu_vendor")) and not layer.get("gpus"):
        layer["gpus"] = 1
        notes.append(f"{where}: a GPU model or vendor without {_GPU}: asks for 1 GPU")


def _variables(env: Any, resolver: _Resolver, where: str, notes: list[str]) -> dict[str, str]:
    """An environment's plain variables (its scripts are not run: a note)."""
    name = str(env.name)
    if env.script is not None:
        notes.append(
            f"{where}: environment '{name}': its script (onEnter/onExit) is not run; only its variables are set"
        )
    out: dict[str, str] = {}
    for key, value in (env.variables or {}).items():
        text = resolver.resolve(value, {}, (), f"{where}: environment '{name}'.variables.{key}")
        if _MARK_OPEN in text:
            raise InvalidInput(
                f"{where}: environment '{name}'.variables.{key}: refers to the session's directory, "
                "which an environment variable cannot be given"
            )
        out[str(key)] = text
    return out


class _Command:
    """Builds a layer's command: an argv when nothing needs the frame's directory, else a
    shell string that writes the embedded files into a temporary directory first."""

    def __init__(self, step: Any, resolver: _Resolver, where: str) -> None:
        script = step.script
        self.action = script.actions.onRun
        self.files = list(script.embeddedFiles or [])
        self.resolver = resolver
        self.where = where
        self.names = [str(f.name) for f in self.files]

    def argv(self, task: Mapping[str, str]) -> list[str]:
        words = [self.action.command, *(self.action.args or [])]
        return [self.resolver.resolve(w, task, self.names, f"{self.where}.script.actions.onRun") for w in words]

    def _pieces(self, text: str) -> list[str]:
        """``text`` cut at its markers: literal pieces quoted for sh, markers as paths under "$d"."""
        out: list[str] = []
        pos = 0
        for match in _MARK_RE.finditer(text):
            if match.start() > pos:
                out.append(shlex.quote(text[pos : match.start()]))
            out.append(self._path(match.group(1)))
            pos = match.end()
        if pos < len(text) or not out:
            out.append(shlex.quote(text[pos:]))
        return out

    def _shell_word(self, text: str) -> str:
        """``text`` as one sh word, with markers as paths under "$d"."""
        return "".join(self._pieces(text))

    def _path(self, mark: str) -> str:
        if mark == _SESSION_DIR:
            return '"$d"'
        name = mark.split(":", 1)[1]
        return f'"$d/{self._filename(name)}"'

    def _filename(self, name: str) -> str:
        for f in self.files:
            if str(f.name) == name:
                return str(f.filename) if f.filename else name
        return name

    def _printf_args(self, text: str) -> str:
        """``text`` as printf '%s' arguments (one per piece)."""
        return " ".join(self._pieces(text))

    def branch(self, task: Mapping[str, str]) -> str:
        """One task's shell commands: write its files, run the action."""
        parts = []
        for f in self.files:
            where = f"{self.where}.script.embeddedFiles[{f.name}]"
            data = self.resolver.resolve(f.data, task, self.names, where)
            path = f'"$d/{self._filename(str(f.name))}"'
            parts.append(f"printf '%s' {self._printf_args(data)} > {path}")
            if f.runnable:
                parts.append(f"chmod +x {path}")
        parts.append(" ".join(self._shell_word(w) for w in self.argv(task)))
        return " && ".join(parts)

    def needs_shell(self, task: Mapping[str, str]) -> bool:
        return bool(self.files) or any(_MARK_OPEN in w for w in self.argv(task))


# The frame's files live in a temporary directory, removed when the command ends; the
# frame itself runs where cuectl runs frames (the job's directory), not in it.
_PREAMBLE = "d=$(mktemp -d) || exit 1; trap 'rm -rf \"$d\"' EXIT; "


def _shell(body: str) -> str:
    return _PREAMBLE + body


def _step_layer(
    step: Any, model: Any, resolver: _Resolver, names: Mapping[str, str], job_env: Mapping[str, str], notes: list[str]
) -> dict[str, Any]:
    where = f"step '{step.name}'"
    layer: dict[str, Any] = {"name": names[str(step.name)]}
    command = _Command(step, resolver, where)
    space = step.parameterSpace
    defs = dict(space.taskParameterDefinitions) if space is not None else {}
    single_int = None
    if len(defs) == 1:
        ((pname, pdef),) = defs.items()
        if str(getattr(pdef.type, "value", pdef.type)) == "INT" and getattr(pdef, "chunks", None) is None:
            frames = _frame_range(pdef)
            if frames is not None:
                single_int = (pname, frames)
    if single_int is not None or not defs:
        task: dict[str, str] = {}
        if single_int is not None:
            pname, layer["range"] = single_int
            task = {f"Task.Param.{pname}": "#IFRAME#", f"Task.RawParam.{pname}": "#IFRAME#"}
        if command.needs_shell(task):
            layer["command"] = _shell(command.branch(task))
        else:
            layer["command"] = command.argv(task)
    else:
        # Any other parameter space: task i (in OpenJD's order) is frame i, and the command
        # picks that task's values with a case on the frame number.
        tasks = list(model.StepParameterSpaceIterator(space=space))
        layer["range"] = f"1-{len(tasks)}"
        branches = []
        for task_values in tasks:
            table: dict[str, str] = {}
            for pname, value in task_values.items():
                table[f"Task.Param.{pname}"] = str(value.value)
                table[f"Task.RawParam.{pname}"] = str(value.value)
            branches.append(command.branch(table))
        if len(set(branches)) == 1 and not command.needs_shell({}) and len(tasks) > 0:
            first = dict((f"Task.Param.{p}", str(v.value)) for p, v in tasks[0].items())
            layer["command"] = command.argv(first)
        elif len(set(branches)) == 1:
            layer["command"] = _shell(branches[0])
        else:
            cases = " ".join(f"{i}) {body} ;;" for i, body in enumerate(branches, start=1))
            preamble = _PREAMBLE if any('"$d' in body for body in branches) else ""
            layer["command"] = (
                preamble + f"case #IFRAME# in {cases} *) echo 'no task for frame #IFRAME#' >&2; exit 1 ;; esac"
            )
        notes.append(
            f"{where}: its parameter space ({', '.join(defs)}) becomes frames 1-{len(tasks)}, "
            "one per task in OpenJD's order"
        )
    action = command.action
    if action.timeout is not None:
        try:
            layer["timeout"] = int(str(action.timeout))
        except ValueError:
            notes.append(f"{where}: onRun timeout {action.timeout!s} not honoured")
    if action.cancelation is not None:
        notes.append(f"{where}: onRun cancelation not honoured (cuectl kills the frame's process group)")
    env = dict(job_env)
    for step_env in step.stepEnvironments or []:
        env.update(_variables(step_env, resolver, where, notes))
    if env:
        layer["env"] = env
    _host_requirements(step, layer, where, notes)
    deps = [names[str(d.dependsOn)] for d in step.dependencies or []]
    if deps:
        layer["depends"] = [{"layer": d, "type": "layer"} for d in deps]
    return layer


def openjd_to_spec(
    template: Mapping[str, Any],
    params: Mapping[str, str] | Iterable[str] = (),
    *,
    template_dir: str | None = None,
    cwd: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """An OpenJD job template and ``--param NAME=VALUE`` values (or a mapping) as a cuectl
    job-spec mapping, and the notes about what could not be honoured.

    ``template_dir``: where the template lives (relative PATH defaults are joined to it);
    ``cwd``: where the submit happens (relative PATH values given as parameters). Raises
    InvalidInput with the validator's message on one line, or naming the extra to install
    when openjd-model is missing.
    """
    model = _import_model()
    values = _parse_params(params)
    base = Path(cwd or ".").resolve()
    try:
        job_template = model.decode_job_template(template=dict(template))
    except (model.DecodeValidationError, NotImplementedError, ValueError) as exc:
        raise InvalidInput(f"not a valid Open Job Description job template: {_one_line(str(exc))}") from None
    try:
        parameters = model.preprocess_job_parameters(
            job_template=job_template,
            job_parameter_values=values,
            job_template_dir=Path(template_dir).resolve() if template_dir else base,
            current_working_dir=base,
            allow_job_template_dir_walk_up=True,
        )
        job = model.create_job(job_template=job_template, job_parameter_values=parameters)
    except (model.DecodeValidationError, ValueError, NotImplementedError) as exc:
        raise InvalidInput(
            f"job parameters: {_one_line(str(exc))}", hint="give values with --param NAME=VALUE"
        ) from None
    symbols: dict[str, str] = {}
    for pname, pvalue in parameters.items():
        symbols[f"Param.{pname}"] = str(pvalue.value)
        symbols[f"RawParam.{pname}"] = str(pvalue.value)
    notes: list[str] = []
    names = _layer_names(job.steps, notes)
    job_env: dict[str, str] = {}
    resolver = _Resolver(model, symbols, "")
    for env in job.jobEnvironments or []:
        job_env.update(_variables(env, resolver, "jobEnvironments", notes))
    layers = []
    for step in job.steps:
        layers.append(_step_layer(step, model, _Resolver(model, symbols, str(step.name)), names, job_env, notes))
    return {"name": str(job.name), "layers": layers}, notes
