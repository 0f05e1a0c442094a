"""Benchmark models: generated once with `skippy make-model` into a cache directory and
reused while their spec is unchanged (the spec's digest is part of the file name)."""
import hashlib
import os
import shlex
import subprocess


def model_file(cache_dir, profile, name, spec_args):
    digest = hashlib.sha256(" ".join(spec_args).encode()).hexdigest()[:10]
    return os.path.join(cache_dir, f"bench-{profile}-{name}-{digest}.gguf")


def ensure_model(skippy, cache_dir, profile, name, spec_args):
    """Returns (path, command, reused). The command is the exact make-model invocation."""
    path = model_file(cache_dir, profile, name, spec_args)
    command = [skippy, "make-model", "--out", path] + list(spec_args)
    if os.path.exists(path):
        return path, shlex.join(command), True
    os.makedirs(cache_dir, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        subprocess.run([skippy, "make-model", "--out", tmp] + list(spec_args), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       timeout=600)
        os.replace(tmp, path)
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"make-model failed for {name}: {e.stderr}") from e
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path, shlex.join(command), False
