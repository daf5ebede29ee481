"""Stand-in for ansible-test's pip bootstrap script (get-pip.py), which it downloads from
ci-files.testing.ansible.com -- a host our build machines cannot reach. ansible-test first looks for a
cached copy (~/.ansible/test/cache/get_pip_<version>.py); tools/test.sh installs this file there.

It does what get-pip does for ansible-test's venvs: put pip into the running interpreter (from the
standard library's ensurepip), then install the requested pip version and packages from the package
index this machine can reach.
"""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"], stdout=subprocess.DEVNULL)
subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
