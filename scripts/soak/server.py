"""The `hearth serve` under soak: starting it, reading its log, sampling its process, stopping it."""

import http.client
import os
import re
import signal
import subprocess
import threading
import time

from common import INITIAL_BALANCE, MODELS_TOML, SERVICES, SMOLLM2
from wire import get_json


class Server:
    """A `hearth serve` this script started, in its own session so that a Ctrl-C meant for the
    driver does not reach it first; its log goes to a file, read as it comes so that the server
    never blocks on a full pipe."""

    def __init__(self, binary, run_dir, log_path, postgres, services=SERVICES, models_toml=None):
        """`services` to start, and `models_toml` the model table to serve (default: the soak's,
        on SmolLM2 and the tiny image model written into the run dir)."""
        self.binary, self.run_dir, self.log_path = binary, run_dir, log_path
        self.services = tuple(services)
        self.models_toml = models_toml
        self.data_dir = os.path.join(run_dir, "data")
        self.config = os.path.join(run_dir, "hearth.toml")
        self.models = os.path.join(run_dir, "models.toml")
        self.env = dict(os.environ)
        self.env.setdefault("RUST_LOG", "hearth=info,tower_http=info")
        # The URL goes by environment, never into a file in the run dir (it may hold a password).
        if postgres:
            self.env["HEARTH_STORE_URL"] = postgres
        self.urls = {}
        self.log_levels = {"WARN": 0, "ERROR": 0}
        self.log_messages = {}  # "LEVEL target: message" -> count, for the summary
        self.proc = None

    def prepare(self):
        os.makedirs(self.data_dir, exist_ok=True)
        with open(self.models, "w") as f:
            f.write(self.models_toml if self.models_toml is not None else MODELS_TOML.format(w=SMOLLM2))
        # A config file of our own, so that a hearth.toml in the working directory is not read.
        with open(self.config, "w") as f:
            f.write(f'[billing]\ninitial_balance = "{INITIAL_BALANCE}"\ndefault_margin_percent = "0"\n')
        self.cli("dev", "tiny-sdxl", os.path.join(self.run_dir, "tiny-sdxl"), common=False)

    def cli(self, *args, common=True):
        """Runs a `hearth` subcommand against this server's data dir; returns its stdout."""
        cmd = [self.binary, *args]
        if common:
            cmd += ["--config", self.config, "--data-dir", self.data_dir]
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def start(self):
        cmd = [self.binary, "serve", "--config", self.config, "--data-dir", self.data_dir,
               "--models", self.models, "--services", ",".join(self.services)]
        for s in self.services:
            cmd += [f"--{s}-addr", "127.0.0.1:0"]
        self.proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        listening = threading.Event()
        threading.Thread(target=self._read_log, args=(listening,), daemon=True).start()
        if not listening.wait(120):
            self.kill()
            raise RuntimeError(f"hearth serve did not listen within 120 s; its log: {self.log_path}")
        if self.proc.poll() is not None:
            raise RuntimeError(f"hearth serve exited with {self.proc.returncode}; its log: {self.log_path}")

    def _read_log(self, listening):
        pattern = re.compile(r"listening service=(\w+) addr=(\S+)")
        level = re.compile(r"^\S+\s+(WARN|ERROR)\s+(.*)$")
        with open(self.log_path, "w") as out:
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                out.write(line + "\n")
                out.flush()
                m = pattern.search(line)
                if m:
                    self.urls[m.group(1)] = m.group(2)
                    if len(self.urls) == len(self.services):
                        listening.set()
                m = level.match(line)
                if m:
                    self.log_levels[m.group(1)] += 1
                    # Key by level, target and the message up to its structured fields, so that
                    # one kind of warning is one entry however many times it recurs.
                    text = re.sub(r"^(\S+?\{[^}]*\}:)+\s*", "", m.group(2))
                    text = re.split(r"\s\w+=", text, maxsplit=1)[0][:120]
                    key = f"{m.group(1)} {text}"
                    self.log_messages[key] = self.log_messages.get(key, 0) + 1
        listening.set()  # the log ended: the process is gone

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout=300):
        """Waits until every model says it is ready (the text engine loads in the background)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.alive():
            try:
                text = get_json(self.urls["completion"], "/")
                image = get_json(self.urls["imagine"], "/") if "imagine" in self.urls else None
                if all(s == "ready" for s in text["models"].values()) and (
                        image is None or image["model"]["status"] == "ready"):
                    return
                failed = [m for m, s in text["models"].items() if s.startswith("unavailable")]
                if failed:
                    raise RuntimeError(f"models failed to load: {text['models']}; log: {self.log_path}")
            except (OSError, ValueError, KeyError, http.client.HTTPException):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the models did not get ready within {timeout} s; log: {self.log_path}")

    def sample(self):
        """RSS, threads, open fds of the server process, and its children (conversion workers)."""
        pid = self.proc.pid
        status = read_proc_status(pid)
        try:
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            fds = 0
        children = []
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    children += [int(p) for p in f.read().split()]
        except OSError:
            pass
        child_rss = sum(read_proc_status(c).get("VmRSS", 0) for c in children)
        return {"rss_kib": status.get("VmRSS", 0), "hwm_kib": status.get("VmHWM", 0),
                "threads": status.get("Threads", 0), "fds": fds,
                "workers": len(children), "workers_rss_kib": child_rss}

    def stop(self, timeout=40):
        """SIGTERM, as an operator stops it; the exit status, or None if it had to be killed."""
        if not self.alive():
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        if self.alive():
            self.proc.kill()
            self.proc.wait()


def read_proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "Threads"):
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out
