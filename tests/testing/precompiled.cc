// The source of tessera_test_pch (tests/CMakeLists.txt): the target exists
// to compile the headers every test binary shares once, as a precompiled
// header the tests reuse. It has no code of its own; gtest_main gives it a
// main() so that it links like a test binary.
