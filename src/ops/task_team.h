// A team of threads held in one OpenMP parallel region for a whole run of small nodes (a decode
// step), so that each parallel node hands its tasks to threads already waiting instead of opening a
// parallel region of its own.
//
// Why: a decode step makes about 50 weight products of 50-200 us each, with a few microseconds of
// one-thread work (normalizations, rotary, attention bookkeeping) between them. libgomp opens and
// closes a region per product (the workers wake, and each region ends in a barrier that wakes the
// caller). An emulation of the bench Llama's float16 step (its 49 calls' sizes and tasks, 8 us of
// one-thread work between calls) took 5.18-5.60 ms with the threads held against 5.57-5.89 ms with
// a region per call, and 5.15-5.36 ms as one call of all the step's tasks.
//
// TaskTeam::Run(threads, body) runs body on the calling thread (the leader) while the team's other
// threads spin, waiting for work; ForEach, called by the leader inside body, hands out tasks to
// every thread of the team, the leader included, and returns when all are done. Kernels reach the
// team through ParallelFor (ops/kernel_util.h) and the panel products' task runners
// (ops/panel_tiles.h); every other OpenMP region opened inside body runs on the leader alone (the
// runtime does not nest teams), so a run is led by a team only where its parallel work goes
// through those (Session::Run decides, runtime/session.cc).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <unordered_map>

namespace gaf {

// What a run's kernels tell the session, on the calling thread, for the choice of a team for the
// next run of the same shapes: the most rows a weight product (the panel products, whose tasks go
// to the team) took. The session clears it before a run and reads it after.
// And whether a kernel ran parallel work in a region of its own (a convolution, a oneDNN
// primitive, a prompt's attention): inside a team such a region gets one thread, so a run with
// one is not led by a team.
struct RunHints {
  int64_t max_product_rows = 0;
  bool own_regions = false;
};
RunHints& ThisThreadRunHints();
inline void NoteProductRows(int64_t rows) {
  RunHints& h = ThisThreadRunHints();
  if (rows > h.max_product_rows) h.max_product_rows = rows;
}
// Called by a kernel before it opens a parallel region of its own (not through ParallelFor or
// the panel task runners) for work that wants several threads.
inline void NoteOwnParallelRegion() { ThisThreadRunHints().own_regions = true; }

// What one thread reads first in a weight product: up to four streams read side by side (a task's
// panels), `bytes` of each from its start.
struct FirstReads {
  const char* p[4] = {};
  int64_t bytes = 0;
  int streams = 0;
};

// Read-ahead across a run's weight products (the pipelining of the original's "scheduling"
// stage), learned from run to run: a decode step runs the same products in the same order, so
// each product remembers what the product after it read first the last time. While a product's
// last tasks end, and through the one-thread work after it (normalizations, rotary, attention),
// the threads with no task left prefetch what they will read first in the next product into
// their L2, instead of waiting with the memory idle. In the bench Llama's decode steps the
// threads waited about a tenth of the step (tasks' ends and one-thread work); with the read-ahead
// the steps ran 2.5-7.1% faster in float32 and 4.8% with float16 weights, side by side in one
// process (`bench`'s `+ read-ahead` row; 0-2.5% at loaded minutes; between separate processes not
// beyond their noise: docs/benchmarks.md). The caller of TaskTeam::Run keeps one for the runs of one model
// (Session); a hint only: a wrong or stale entry costs reads, never results.
class ReadAhead {
 public:
  static constexpr int kMaxThreads = 8;  // threads whose first reads are remembered
  // Entries past this many (products announced by other graphs' runs) start the learning afresh.
  static constexpr size_t kMaxEntries = 4096;
  size_t size() const { return next_.size(); }

 private:
  friend class TaskTeam;
  struct Entry {
    FirstReads reads[kMaxThreads];
    int count = 0;
  };
  std::unordered_map<const void*, Entry> next_;  // a product's key -> what came next read first
  const void* last_ = nullptr;                   // the last product announced
};

class TaskTeam {
 public:
  // body() on the calling thread with a team of `threads` (fewer where the OpenMP runtime gives
  // fewer) waiting for ForEach's tasks; body's exception, if any, is rethrown after the team is
  // closed. With threads < 2 or more than the cores (the waiting threads spin), or inside a
  // parallel region, body() runs alone (no team).
  // With `read_ahead`, the products that announce themselves (Announce) learn in it what comes
  // next and prefetch it.
  static void Run(int threads, const std::function<void()>& body, ReadAhead* read_ahead = nullptr);
  // The team the calling thread leads and may hand tasks to now (inside Run's body, not inside one
  // of the team's tasks), or null.
  static TaskTeam* Active();

  // fn(t, next) for every t in [0, n): the team's threads claim tasks in order from a shared
  // counter, one when the last ends (next is -1); with `ahead`, each claims its next task when it
  // starts one and tells fn (-1: none), so that a task can prefetch what its thread reads next
  // (RunPanelTasksAhead). Returns when every task is done. A task that throws on the leader stops
  // the tasks not yet started and rethrows here once the others end; on another thread it ends
  // the process, as in an OpenMP region.
  void ForEach(int64_t n, const std::function<void(int64_t, int64_t)>& fn, bool ahead = false);

  int threads() const { return threads_; }

  // Called by a weight product before its ForEach: `key` names the product (its weights), first[r]
  // what the thread of rank r (0: the leader) reads first in it (rank r usually takes task r first:
  // the leader claims as it publishes, the others as they see the job). Records them as what follows
  // the product announced before, and has the threads prefetch, once they have no task of this
  // product left, what followed this one the last time. Without a ReadAhead, nothing.
  void Announce(const void* key, const FirstReads* first, int count);
  // The bytes the team's threads have prefetched ahead so far (tests, profiles).
  int64_t read_ahead_bytes() const { return read_ahead_bytes_.load(std::memory_order_relaxed); }

 private:
  struct Job;
  void Work();
  static void Drain(Job& job, std::exception_ptr* on_error);

  int threads_ = 1;
  std::atomic<Job*> job_{nullptr};
  std::atomic<uint64_t> published_{0};  // the sequence number of the last job handed out
  std::atomic<int> busy_{0};            // threads other than the leader inside a job
  std::atomic<bool> stop_{false};
  ReadAhead* read_ahead_ = nullptr;
  const ReadAhead::Entry* next_reads_ = nullptr;  // for the next ForEach (Announce)
  std::atomic<int64_t> read_ahead_bytes_{0};
  bool in_job_ = false;  // the leader is running a job's task (nested ParallelFor calls run inline)
};

}  // namespace gaf
