#include "ops/task_team.h"

#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GAF_PAUSE() _mm_pause()
#else
#define GAF_PAUSE() ((void)0)
#endif

namespace gaf {

namespace {
thread_local TaskTeam* tl_leading = nullptr;
}  // namespace

// One ForEach call, on the leader's stack: tasks are claimed from `next` (each claim one index) and
// counted in `done` when they end (run, or skipped after a failure).
struct TaskTeam::Job {
  const std::function<void(int64_t, int64_t)>* fn;
  int64_t n;
  uint64_t seq;
  bool ahead;
  const ReadAhead::Entry* reads;  // what each rank prefetches once it has no task left (or null)
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::atomic<bool> failed{false};
};

RunHints& ThisThreadRunHints() {
  thread_local RunHints hints;
  return hints;
}

TaskTeam* TaskTeam::Active() {
  TaskTeam* t = tl_leading;
  return t != nullptr && !t->in_job_ ? t : nullptr;
}

namespace {

// Bytes of one thread's read-ahead: its L2 (the next product's first task fits it at the bench
// Llama's K = 1024: four 48-column panels, 786 KiB; 512 and 768 KiB read ahead gained less).
int64_t ReadAheadBudget() {
  static const int64_t budget = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 >= (64 << 10) && l2 <= (64 << 20) ? static_cast<int64_t>(l2) : int64_t{512} << 10;
  }();
  return budget;
}

// A thread's prefetch of its FirstReads in steps of 256 bytes a stream, into L2 (the panels' own
// tiles read them from there), until done or `stop()`; returns the bytes asked for.
template <class Stop>
int64_t PrefetchReads(const FirstReads& r, Stop&& stop) {
  if (r.streams <= 0 || r.streams > 4 || r.bytes <= 0) return 0;
  const int64_t each = std::min(r.bytes, ReadAheadBudget() / r.streams);
  int64_t off = 0;
  for (; off < each && !stop(); off += 256)
    for (int s = 0; s < r.streams; ++s)
      for (int l = 0; l < 256; l += 64) __builtin_prefetch(r.p[s] + off + l, 0, 2);
  return std::min(off, each) * r.streams;
}

}  // namespace

void TaskTeam::Announce(const void* key, const FirstReads* first, int count) {
  if (read_ahead_ == nullptr || key == nullptr) return;
  ReadAhead& ra = *read_ahead_;
  if (ra.last_ != nullptr && ra.last_ != key) {
    if (ra.next_.size() >= ReadAhead::kMaxEntries && ra.next_.count(ra.last_) == 0) ra.next_.clear();
    ReadAhead::Entry& e = ra.next_[ra.last_];
    e.count = std::max(0, std::min(count, ReadAhead::kMaxThreads));
    for (int i = 0; i < e.count; ++i) e.reads[i] = first[i];
  }
  ra.last_ = key;
  auto it = ra.next_.find(key);
  next_reads_ = it != ra.next_.end() ? &it->second : nullptr;
}

void TaskTeam::Run(int threads, const std::function<void()>& body, ReadAhead* read_ahead) {
  // Never more threads than cores: threads that spin while they wait must each have one.
  // (The processors asked once: omp_get_num_procs() is a system call, about 1 us a decode step.)
  static const int procs = omp_get_num_procs();
  if (threads < 2 || threads > procs || omp_in_parallel() || tl_leading != nullptr) return body();
  TaskTeam team;
  team.read_ahead_ = read_ahead;
  std::exception_ptr error;
#pragma omp parallel num_threads(threads)
  {
    if (omp_get_thread_num() == 0) {
      team.threads_ = omp_get_num_threads();
      tl_leading = &team;
      try {
        body();
      } catch (...) {
        error = std::current_exception();
      }
      tl_leading = nullptr;
      team.stop_.store(true, std::memory_order_release);
    } else {
      team.Work();
    }
  }
  if (error) std::rethrow_exception(error);
}

// Claims and runs tasks until none is left (with `ahead`, t is claimed, then the thread's next
// task when t starts); a thread's claims are in increasing order. `on_error` (the leader's) takes
// a task's exception and stops the tasks not started; without one an exception leaves the thread.
void TaskTeam::Drain(Job& job, std::exception_ptr* on_error) {
  int64_t t = job.next.fetch_add(1, std::memory_order_relaxed);
  while (t < job.n) {
    const int64_t next = job.ahead ? job.next.fetch_add(1, std::memory_order_relaxed) : -1;
    if (!job.failed.load(std::memory_order_relaxed)) {
      if (on_error == nullptr) {
        (*job.fn)(t, next < job.n ? next : -1);
      } else {
        try {
          (*job.fn)(t, next < job.n ? next : -1);
        } catch (...) {
          if (!*on_error) *on_error = std::current_exception();
          job.failed.store(true, std::memory_order_relaxed);
        }
      }
    }
    job.done.fetch_add(1, std::memory_order_acq_rel);
    t = job.ahead ? next : job.next.fetch_add(1, std::memory_order_relaxed);
  }
}

void TaskTeam::Work() {
  uint64_t seen = 0;
  int idle = 0;
  const int rank = omp_get_thread_num();
  FirstReads ahead;  // what to prefetch while no job is published (the last job's read-ahead)
  while (!stop_.load(std::memory_order_acquire)) {
    const uint64_t published = published_.load(std::memory_order_acquire);
    if (published == seen && ahead.streams > 0) {
      const int64_t bytes = PrefetchReads(ahead, [&] {
        return published_.load(std::memory_order_relaxed) != seen || stop_.load(std::memory_order_relaxed);
      });
      read_ahead_bytes_.fetch_add(bytes, std::memory_order_relaxed);
      ahead = FirstReads();
      continue;
    }
    if (published == seen) {
      // Spins through the short gaps of a decode step (a few microseconds between products); past
      // kSpins pauses without work it yields the core between checks, so that a thread that
      // shares its core with others (a host busier than the team thought) does not starve them.
      constexpr int kSpins = 4096;
      if (++idle < kSpins) {
        GAF_PAUSE();
      } else {
        std::this_thread::yield();
      }
      continue;
    }
    idle = 0;
    // The leader waits for busy_ to fall to 0 after it takes the job back, so a job read here,
    // after busy_ was raised, lives until busy_ is lowered again.
    busy_.fetch_add(1, std::memory_order_seq_cst);
    Job* job = job_.load(std::memory_order_seq_cst);
    seen = published;
    if (job != nullptr && job->seq >= published) {  // (null: taken back before we came)
      seen = job->seq;
      Drain(*job, nullptr);
      if (job->reads != nullptr && rank < job->reads->count) ahead = job->reads->reads[rank];
    }
    busy_.fetch_sub(1, std::memory_order_release);
  }
}

void TaskTeam::ForEach(int64_t n, const std::function<void(int64_t, int64_t)>& fn, bool ahead) {
  if (n <= 0) return;
  Job job;
  job.fn = &fn;
  job.n = n;
  job.ahead = ahead;
  job.reads = next_reads_;  // entries live as long as the ReadAhead; only this thread changes them
  next_reads_ = nullptr;
  job.seq = published_.load(std::memory_order_relaxed) + 1;
  job_.store(&job, std::memory_order_seq_cst);
  published_.store(job.seq, std::memory_order_release);
  std::exception_ptr error;
  in_job_ = true;
  Drain(job, &error);
  in_job_ = false;
  if (job.reads != nullptr && job.reads->count > 0 && job.done.load(std::memory_order_acquire) < n) {
    // The leader's own read-ahead while the other threads end their tasks.
    const int64_t bytes =
        PrefetchReads(job.reads->reads[0], [&] { return job.done.load(std::memory_order_acquire) >= n; });
    read_ahead_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  while (job.done.load(std::memory_order_acquire) < n) GAF_PAUSE();
  job_.store(nullptr, std::memory_order_seq_cst);
  while (busy_.load(std::memory_order_seq_cst) != 0) GAF_PAUSE();
  if (error) std::rethrow_exception(error);
}

}  // namespace gaf
