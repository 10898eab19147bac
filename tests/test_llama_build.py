"""The Makefile builds llama.cpp for the CPU it runs on: AVX2 always, AVX-512 and its VNNI/BF16
only where /proc/cpuinfo lists them, never -march=native or AMX (docs/llm-time.md), and keeps
each flag set's wheel apart. The venv's llama.cpp has what this machine's flags asked for."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bridge_assets.paths import PROJECT_ROOT

XEON = "flags : fpu sse2 avx avx2 fma f16c avx512f avx512cd avx512vl avx512dq avx512bw avx512_vnni avx512_bf16 avx_vnni amx_tile amx_int8\n"
AVX2_ONLY = "flags : fpu sse2 avx avx2 fma f16c\n"


def setup_commands(tmp_path: Path, cpuinfo: str | None) -> str:
    """What `make setup` would run in a fresh copy of the project, for a CPU listing `cpuinfo`."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    for name in ("Makefile", "requirements.txt", "constraints.txt", "pyproject.toml"):
        shutil.copy(PROJECT_ROOT / name, project / name)
    args = ["make", "-n", "setup"]
    if cpuinfo is not None:
        (tmp_path / "cpuinfo").write_text(cpuinfo)
        args.append(f"CPUINFO={tmp_path / 'cpuinfo'}")
    done = subprocess.run(args, cwd=project, capture_output=True, text=True, check=True)
    return done.stdout


def cmake_flags(commands: str) -> dict[str, str]:
    built = re.search(r'CMAKE_ARGS="([^"]*)" \S+/pip wheel', commands)
    assert built, commands
    return dict(re.findall(r"-D(\w+)=(\w+)", built.group(1)))


def wheel_folder(commands: str) -> str:
    return re.search(r"-w (\S+) llama-cpp-python==", commands).group(1)


def test_the_build_follows_the_cpu_and_never_goes_native_or_amx(tmp_path):
    xeon, older = setup_commands(tmp_path, XEON), setup_commands(tmp_path, AVX2_ONLY)
    with_avx512, without = cmake_flags(xeon), cmake_flags(older)
    for flags in (with_avx512, without):
        assert flags["GGML_NATIVE"] == "OFF" and flags["GGML_AVX2"] == "ON" and flags["GGML_FMA"] == "ON"
        assert {flags[f] for f in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")} == {"OFF"}
    assert {with_avx512[f] for f in ("GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
                                     "GGML_AVX_VNNI")} == {"ON"}
    assert {without[f] for f in ("GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16",
                                 "GGML_AVX_VNNI")} == {"OFF"}
    # one wheel folder per flag set: a wheel built for one CPU is never installed for another
    assert wheel_folder(xeon) != wheel_folder(older)
    # the install takes the wheel from that folder, with the same flags should pip build anyway
    assert f"--find-links {wheel_folder(xeon)}" in xeon


def test_the_installed_llama_cpp_has_what_this_cpu_was_built_for(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    flags = cmake_flags(setup_commands(tmp_path, None))
    info = llama_cpp.llama_print_system_info().decode()
    assert "AVX2 = 1" in info
    for flag, feature in (("GGML_AVX512", "AVX512"), ("GGML_AVX512_VNNI", "AVX512_VNNI"),
                          ("GGML_AVX_VNNI", "AVX_VNNI")):
        assert (f"{feature} = 1" in info) == (flags[flag] == "ON"), (flag, info)
    assert "AMX" not in info
