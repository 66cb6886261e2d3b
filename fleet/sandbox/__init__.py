"""Rehearsal hosts on this machine: real OpenSSH sshd processes and the real vLLM source."""
