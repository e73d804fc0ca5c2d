// RunThreads: ranks as threads of one test process.
//
// Thread-safe; `fn` runs on `n` threads at once and must be.
#ifndef TESSERA_TESTS_TESTING_RUN_THREADS_H_
#define TESSERA_TESTS_TESTING_RUN_THREADS_H_

#include <functional>
#include <thread>
#include <vector>

namespace tessera::testing {

// Runs fn(r) for r in [0, n) on n threads and joins them.
inline void RunThreads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_TESTING_RUN_THREADS_H_
