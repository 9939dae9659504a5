"""Hangs and desyncs from PyTorch Flight Recorder dumps: read every rank's dump (dumps), line
the ranks up per process group and sequence number and find where they parted (verdict), print
it (render). `tracelab hang DUMPS` runs them; docs/hang.md says what it reads and decides."""
