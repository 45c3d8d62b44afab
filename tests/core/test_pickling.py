"""User code travels to a worker with its file and line numbers, whatever cloudpickle is installed."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import traceback

from rpc_collectors.core import pickling


def _raiser():
    def make_env():  # nested: not importable, so it travels by value, code object included
        raise RuntimeError("simulator licence not found")

    return make_env


def test_a_function_sent_by_value_keeps_its_file_and_line_and_its_traceback_shows_the_source():
    fn = _raiser()
    loaded = pickling.loads(pickling.dumps(fn))
    assert loaded is not fn
    assert loaded.__code__.co_filename == __file__
    assert loaded.__code__.co_firstlineno == fn.__code__.co_firstlineno
    try:
        loaded()
    except RuntimeError:
        text = traceback.format_exc()
    assert f'File "{__file__}", line {fn.__code__.co_firstlineno + 1}, in make_env' in text
    assert 'raise RuntimeError("simulator licence not found")' in text


def test_a_closure_of_the_users_main_script_shows_its_line_in_another_process(tmp_path):
    """The path a worker takes: a script's ``__main__`` function pickled in one interpreter and
    called in another."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys
        from rpc_collectors.core import pickling
        scale = 3
        def make_env():
            return 1 / (scale - 3)
        sys.stdout.buffer.write(pickling.dumps(make_env))
    """))
    pickled = subprocess.run([sys.executable, str(script)], capture_output=True, check=True, timeout=60).stdout
    called = subprocess.run(
        [sys.executable, "-c", "import sys, pickle; pickle.loads(sys.stdin.buffer.read())()"],
        input=pickled, capture_output=True, timeout=60,
    )
    assert called.returncode == 1
    err = called.stderr.decode()
    assert f'File "{script}", line 6, in make_env' in err
    assert "return 1 / (scale - 3)" in err
    assert "ZeroDivisionError" in err
