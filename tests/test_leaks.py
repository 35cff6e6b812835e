"""tests/leaks.py: the test that leaves a thread or a child process running fails (issue 34)."""

from __future__ import annotations

import textwrap

from pathlib import Path

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parent.parent

INNER = textwrap.dedent("""
    import subprocess, threading, time

    def test_clean():
        t = threading.Thread(target=time.sleep, args=(0.1,))
        t.start()

    def test_leaves_a_thread():
        stop = threading.Event()
        threading.Thread(target=stop.wait, name="watch-forever", daemon=True).start()

    def test_leaves_a_process():
        subprocess.Popen(["sleep", "8"])
""")


def test_a_thread_or_process_left_running_fails_that_test_only(pytester, monkeypatch):
    monkeypatch.setenv("CORRAL_TEST_LEAK_GRACE_SECONDS", "1")
    pytester.makeconftest('pytest_plugins = ["tests.leaks"]\n')
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "pythonpath=" + str(ROOT))
    result.assert_outcomes(passed=3, errors=2)
    text = result.stdout.str()
    assert "1 thread(s): watch-forever at" in text
    assert "1 child process(es): pid" in text and "sleep 8" in text


def test_tests_on_throwaway_hosts_are_exempt(pytester, monkeypatch):
    monkeypatch.setenv("CORRAL_TEST_LEAK_GRACE_SECONDS", "1")
    pytester.makeconftest('pytest_plugins = ["tests.leaks"]\n')
    pytester.makeini("[pytest]\nmarkers =\n    hostlab: throwaway hosts\n")
    pytester.makepyfile(test_inner=textwrap.dedent("""
        import threading, pytest

        @pytest.mark.hostlab
        def test_boots_a_host_the_module_shares():
            threading.Thread(target=threading.Event().wait, daemon=True).start()
    """))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-o", "pythonpath=" + str(ROOT))
    result.assert_outcomes(passed=1)
