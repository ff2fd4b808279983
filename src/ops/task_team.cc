#include "ops/task_team.h"

#include <omp.h>

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

void TaskTeam::Run(int threads, const std::function<void()>& body) {
  // Never more threads than cores: threads that spin while they wait must each have one.
  if (threads < 2 || threads > omp_get_num_procs() || omp_in_parallel() || tl_leading != nullptr) return body();
  TaskTeam team;
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
  while (!stop_.load(std::memory_order_acquire)) {
    const uint64_t published = published_.load(std::memory_order_acquire);
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
  job.seq = published_.load(std::memory_order_relaxed) + 1;
  job_.store(&job, std::memory_order_seq_cst);
  published_.store(job.seq, std::memory_order_release);
  std::exception_ptr error;
  in_job_ = true;
  Drain(job, &error);
  in_job_ = false;
  while (job.done.load(std::memory_order_acquire) < n) GAF_PAUSE();
  job_.store(nullptr, std::memory_order_seq_cst);
  while (busy_.load(std::memory_order_seq_cst) != 0) GAF_PAUSE();
  if (error) std::rethrow_exception(error);
}

}  // namespace gaf
