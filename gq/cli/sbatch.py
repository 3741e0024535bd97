"""``#SBATCH`` lines in gq's terms (pure): the options gq shares with sbatch are translated,
the rest are reported so that nothing is dropped silently."""

from __future__ import annotations

import re

# sbatch spelling -> gq option; None marks a flag that takes no value.
SHARED: dict[str, tuple[str, bool]] = {
    "-J": ("--job-name", True), "--job-name": ("--job-name", True),
    "-G": ("--gpus", True), "--gpus": ("--gpus", True),
    "--mem": ("--mem", True),
    "-t": ("--time", True), "--time": ("--time", True),
    "-o": ("--output", True), "--output": ("--output", True),
    "-e": ("--error", True), "--error": ("--error", True),
    "-D": ("--chdir", True), "--chdir": ("--chdir", True),
    "-a": ("--array", True), "--array": ("--array", True),
    "-d": ("--dependency", True), "--dependency": ("--dependency", True),
    "--requeue": ("--requeue", False),
    "--deadline": ("--deadline", True),
    "--exclusive": ("--exclusive", False),
    "-H": ("--hold", False), "--hold": ("--hold", False),
}
_GRES_GPU = re.compile(r"^gpu(?::[A-Za-z][\w.-]*)?(?::(\d+))?$")  # gpu[:type][:count]


def translate(tokens: list[str]) -> tuple[list[str], list[str]]:
    """gq tokens for one #SBATCH line, and the sbatch options gq does not use."""
    out: list[str] = []
    ignored: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        name, has_equals, value = token.partition("=")
        if not has_equals and len(name) > 2 and name[0] == "-" and name[1] != "-":
            name, value, has_equals = name[:2], name[2:], True  # -Jname
        takes_value = name in ("--gres", "--nice") or (name in SHARED and SHARED[name][1])
        if takes_value:
            if not has_equals:
                if name == "--nice" and (index >= len(tokens) or tokens[index].startswith("-")):
                    value = "100"  # sbatch's default adjustment
                elif index < len(tokens):
                    value, index = tokens[index], index + 1
                else:
                    value = ""
        if name == "--gres":
            gpus = [_GRES_GPU.match(part) for part in value.split(",")]
            matched = [m for m in gpus if m]
            if matched:
                out += ["--gpus", str(sum(int(m.group(1) or 1) for m in matched))]
            if len(matched) < len(gpus):
                ignored.append(f"--gres={value}")
        elif name == "--nice":
            out += ["--priority", str(-int(value)) if value.lstrip("-").isdigit() else value]
        elif name in SHARED:
            option, needs_value = SHARED[name]
            out += [option, value] if needs_value else [option]
        else:
            if not has_equals and index < len(tokens) and not tokens[index].startswith("-"):
                index += 1  # its value
            ignored.append(name)
    return out, ignored
