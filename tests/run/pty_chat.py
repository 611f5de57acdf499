#!/usr/bin/env python3
"""pty_chat.py SCENARIO -- ARGV... - drives `salafw run -i` under a
pseudo-terminal (python3's pty module) the way a person types, and prints
one line per observation for tests/test_run_pty.sh:
  stats N prefill=P decode=D context=C finish=F   (each reply's stats line)
  exit CODE | signal SIG                           (how the process ended)
Scenarios:
  ctrlc   type a turn; Ctrl-C mid-reply; type a second turn; Ctrl-C mid-reply;
          type a third turn; Ctrl-C mid-reply; then Ctrl-C at the prompt
  ctrld   type a turn; Ctrl-C mid-reply; then Ctrl-D at the prompt
Every wait is bounded; a timeout prints "timeout WHAT" and ends the child."""
import os
import pty
import re
import select
import signal
import sys
import time

STATS = re.compile(rb"prefill (\d+) tokens .*?decode (\d+) tokens .*?finish (\w+), context (\d+) tokens")


class Child:
    def __init__(self, argv):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execvp(argv[0], argv)
        self.buf = b""
        self.seen_stats = 0

    def read_some(self, timeout):
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return False
        try:
            d = os.read(self.fd, 65536)
        except OSError:
            return None
        if not d:
            return None
        self.buf += d
        return True

    def wait_for(self, pred, what, timeout=60):
        end = time.time() + timeout
        while not pred():
            left = end - time.time()
            if left <= 0:
                print("timeout " + what)
                self.kill()
                sys.exit(1)
            if self.read_some(min(left, 0.2)) is None and not pred():
                print("eof before " + what)
                self.report_exit()
                sys.exit(1)

    def stats(self):
        return [m for m in STATS.finditer(self.buf)]

    def wait_stats(self, n, what):
        self.wait_for(lambda: len(self.stats()) >= n, what)
        m = self.stats()[n - 1]
        print("stats %d prefill=%s decode=%s context=%s finish=%s" % (
            n, m.group(1).decode(), m.group(2).decode(), m.group(4).decode(), m.group(3).decode()))

    def prompts(self):
        return self.buf.count(b"> ")

    def send(self, b):
        os.write(self.fd, b)

    def type_turn(self, text, n_reply):
        """types a line; waits until the reply streams (output after the echo), then Ctrl-C"""
        mark = len(self.buf)
        self.send(text + b"\r")
        self.wait_for(lambda: text in self.buf[mark:], "the echo of %r" % text)
        start = self.buf.index(text, mark) + len(text)
        self.wait_for(lambda: len(self.buf) - start > 200, "reply %d streaming" % n_reply)
        self.send(b"\x03")

    def report_exit(self):
        end = time.time() + 30
        while time.time() < end:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                if os.WIFSIGNALED(st):
                    print("signal %d" % os.WTERMSIG(st))
                else:
                    print("exit %d" % os.WEXITSTATUS(st))
                return
            self.read_some(0.1)
        print("timeout exit")
        self.kill()

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass


def main():
    scen = sys.argv[1]
    argv = sys.argv[sys.argv.index("--") + 1:]
    c = Child(argv)
    c.wait_for(lambda: c.prompts() >= 1, "the first prompt")
    c.type_turn(b"Hello there", 1)
    c.wait_stats(1, "the stats of reply 1")
    c.wait_for(lambda: c.buf.rfind(b"> ") > c.stats()[0].end(), "the prompt after reply 1")
    if scen == "ctrlc":
        for n, t in ((2, b"Tell me more"), (3, b"And then")):
            c.type_turn(t, n)
            c.wait_stats(n, "the stats of reply %d" % n)
            c.wait_for(lambda: c.buf.rfind(b"> ") > c.stats()[n - 1].end(), "the prompt after reply %d" % n)
        time.sleep(0.3)
        c.send(b"\x03")  # at the prompt: ends the chat
    else:
        c.send(b"\x04")  # Ctrl-D at the start of a line: end of input
    c.report_exit()


if __name__ == "__main__":
    main()
