"""Compiles the CUDA kernels Hearth hands to NVRTC at run time (the `const SOURCE: &str = r#"..."#`
of each Rust file given, after the shared prelude of crates/gpu/src/kernels.rs where it
uses it) with NVRTC itself, here, on a machine without a GPU, so that a kernel
that does not compile is found before GPU time is spent on it. NVRTC comes from NVIDIA's
`nvidia-cuda-nvrtc` wheel (fetched into .cache/nvrtc on first use).

    python3 scripts/gpu/nvrtc-check.py crates/infer/src/{decode_attn/source,fused,gemv,kv_write}.rs

Prints each kernel's register and spill report (ptxas, when the toolkit of scripts/build-cuda.sh
is there) and exits non-zero on the first failure.
"""
import ctypes
import glob
import os
import re
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.path.join(ROOT, ".cache", "nvrtc")
VERSION = os.environ.get("NVRTC_WHEEL", "13.0.88")


def libnvrtc():
    lib = os.path.join(CACHE, "nvidia", "cu13", "lib", "libnvrtc.so.13")
    if not os.path.exists(lib):
        os.makedirs(CACHE, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", CACHE,
                        f"nvidia-cuda-nvrtc=={VERSION}"], check=True)
        for whl in glob.glob(os.path.join(CACHE, "nvidia_cuda_nvrtc-*.whl")):
            with zipfile.ZipFile(whl) as z:
                for n in z.namelist():
                    if "/lib/" in n:
                        z.extract(n, CACHE)
    # NVRTC dlopens its builtins by soname: loaded first, they are found.
    ctypes.CDLL(os.path.join(os.path.dirname(lib), "libnvrtc-builtins.so.13.0"), mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(lib)


def compile_source(nvrtc, name, source, arch="compute_90"):
    prog = ctypes.c_void_p()
    check = lambda rc, what: rc == 0 or sys.exit(f"{name}: {what} failed ({rc})")
    check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
          "nvrtcCreateProgram")
    opts = [f"--gpu-architecture={arch}".encode()]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        sys.exit(f"{name}: NVRTC refused the kernel:\n{log.value.decode()}")
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


def main():
    nvrtc = libnvrtc()
    ptxas = os.path.join(ROOT, ".cache", "cuda-13", "nvidia", "cu13", "bin", "ptxas")
    for path in sys.argv[1:]:
        text = open(path).read()
        m = re.search(r'const SOURCE: &str = r#"(.*?)"#;', text, re.S)
        if not m:
            sys.exit(f"{path}: no `const SOURCE: &str = r#\"...\"#;`")
        source = m.group(1)
        if "C::load" in source:  # written against crates/gpu/src/kernels.rs's prelude
            shared = open(os.path.join(ROOT, "crates", "gpu", "src", "kernels.rs")).read()
            source = re.search(r'const PRELUDE: &str = r#"(.*?)"#;', shared, re.S).group(1) + source
        ptx = compile_source(nvrtc, os.path.basename(path), source)
        kernels = re.findall(r"\.entry (\w+)", ptx)
        print(f"{path}: NVRTC compiled {len(kernels)} kernels: {', '.join(kernels)}")
        if os.path.exists(ptxas):
            out = os.path.join(CACHE, "check.ptx")
            with open(out, "w") as f:
                f.write(ptx)
            done = subprocess.run([ptxas, "-arch=sm_90", "-v", out, "-o", os.devnull],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"{path}: ptxas refused the PTX:\n{done.stderr}")
            for line in done.stderr.splitlines():
                if "Used" in line or "spill" in line:
                    print("   ", line.strip())


if __name__ == "__main__":
    main()
