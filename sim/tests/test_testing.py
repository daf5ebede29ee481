"""The test helpers themselves, where a mistake in them made CI fail and a local run pass."""
import os

from npuops_sim import testing


def test_a_command_run_by_the_tests_gets_its_own_stdin_not_the_one_ssh_made_non_blocking():
    """OpenSSH sets O_NONBLOCK on the stdin it inherits (not a tty) and a test's ssh runs while a playbook starts;
    with one shared stdin, ansible-playbook then refused to start ("Ansible requires blocking IO on
    stdin/stdout/stderr"): CI run of stop 34. The test's process stdin is made a non-blocking pipe here."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        proc = testing.run([testing.BIN + "/ansible-playbook", "--version"], check=False, timeout=120)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ansible-playbook [core ")
