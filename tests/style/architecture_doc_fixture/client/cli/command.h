// The tool: named only as tests/client/cli/, which does not count.
