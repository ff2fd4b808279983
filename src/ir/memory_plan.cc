#include "ir/memory_plan.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "ir/error.h"
#include "ir/sanitizer.h"

#if GAF_ASAN
#include <sanitizer/asan_interface.h>
// Under AddressSanitizer a slot no tensor holds is poisoned, so reading a freed tensor's buffer in
// the arena is reported as it is for the allocator's buffers.
#define GAF_ARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define GAF_ARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define GAF_ARENA_POISON(p, n) ((void)(p), (void)(n))
#define GAF_ARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace gaf {
namespace {

thread_local MemoryPlan* active_plan = nullptr;

// A slot's size: the request rounded up to 64 bytes plus an eighth (at least 64 bytes more), so
// a shape that grows by a little each run (a decoder's mask, T + 1 a step) fits for a while.
size_t SlotSize(size_t bytes) {
  const size_t head = std::max<size_t>(64, bytes / 8);
  return (bytes + head + 63) / 64 * 64;
}

// One arena: its memory and the ranges of it that tensors hold now.
struct Arena {
  struct Range {
    size_t offset, size;
    int64_t id;
  };
  void* mem = nullptr;
  size_t bytes = 0;
  std::mutex mu;
  std::vector<Range> live;
  int64_t next_id = 0;

  explicit Arena(size_t n) : bytes(n) {
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t align = n >= kHuge ? kHuge : 64;
    mem = std::aligned_alloc(align, (n + align - 1) / align * align);
    if (mem == nullptr) throw Error(fmt::format("out of memory allocating a {}-byte memory plan arena", n));
    if (align == kHuge) ::madvise(mem, n, MADV_HUGEPAGE);
    GAF_ARENA_POISON(mem, bytes);
  }
  ~Arena() {
    GAF_ARENA_UNPOISON(mem, bytes);
    std::free(mem);
  }

  // Takes [offset, offset + size) when no live range overlaps it: the id, or -1.
  int64_t Take(size_t offset, size_t size) {
    std::lock_guard<std::mutex> lock(mu);
    for (const Range& r : live)
      if (offset < r.offset + r.size && r.offset < offset + size) return -1;
    live.push_back({offset, size, next_id});
    GAF_ARENA_UNPOISON(static_cast<char*>(mem) + offset, size);
    return next_id++;
  }
  void Release(int64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < live.size(); ++i)
      if (live[i].id == id) {
        GAF_ARENA_POISON(static_cast<char*>(mem) + live[i].offset, live[i].size);
        live[i] = live.back();
        live.pop_back();
        return;
      }
  }
};

// What one recorded run allocated: sizes and lifetimes on a clock of allocations and frees.
struct Recording {
  struct Request {
    size_t size;
    int64_t start, end;  // end -1: not freed (yet)
  };
  std::mutex mu;
  std::vector<Request> requests;
  int64_t clock = 0;
  bool open = true;

  void Freed(size_t k) {
    std::lock_guard<std::mutex> lock(mu);
    if (open && k < requests.size()) requests[k].end = clock++;
  }
};

}  // namespace

struct MemoryPlan::Impl {
  // The plan: per request index, its slot (size, offset); size 0 where it is not planned.
  std::vector<size_t> slot_size, slot_offset;
  size_t arena_bytes = 0;
  std::shared_ptr<Arena> arena;
  std::shared_ptr<Recording> recording;  // non-null while a run records
  bool record_next = true;
  bool seen = false;      // a run with this plan happened: the next one records (a session run
                          // once, as shape recording and analysis do, pays nothing)
  bool idle_run = false;  // the current run neither records nor replays
  int misses_in_a_row = 0;  // plans whose first run missed, one after another
  bool first_run_of_plan = false;
  // The current run.
  size_t next = 0;
  int64_t requests = 0, served = 0, unplanned = 0;
  MemoryPlanStats stats;

  // Offsets for the recorded requests freed within the run: greedy by size, each at the lowest
  // offset where it overlaps no placed request whose lifetime overlaps its own.
  void Plan(const Recording& rec) {
    struct Item {
      size_t index, size;
      int64_t start, end;
      size_t offset = 0;
    };
    std::vector<Item> items;
    for (size_t k = 0; k < rec.requests.size(); ++k) {
      const auto& r = rec.requests[k];
      if (r.end >= 0) items.push_back({k, SlotSize(r.size), r.start, r.end});
    }
    std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.size > b.size; });
    std::vector<const Item*> placed, overlapping;
    size_t top = 0;
    for (Item& it : items) {
      overlapping.clear();
      for (const Item* p : placed)
        if (p->start < it.end && it.start < p->end) overlapping.push_back(p);
      std::sort(overlapping.begin(), overlapping.end(),
                [](const Item* a, const Item* b) { return a->offset < b->offset; });
      size_t offset = 0;
      for (const Item* p : overlapping) {
        if (p->offset >= offset + it.size) break;  // the gap before p holds it
        offset = std::max(offset, p->offset + p->size);
      }
      it.offset = offset;
      top = std::max(top, offset + it.size);
      placed.push_back(&it);
    }
    slot_size.assign(rec.requests.size(), 0);
    slot_offset.assign(rec.requests.size(), 0);
    for (const Item& it : items) {
      slot_size[it.index] = it.size;
      slot_offset[it.index] = it.offset;
    }
    arena_bytes = top;
    arena.reset();
    stats.plans++;
    stats.arena_bytes = static_cast<int64_t>(top);
    stats.planned = static_cast<int64_t>(items.size());
  }
};

std::string DescribeMemoryPlan(const MemoryPlanStats& s) {
  if (s.runs == 0) return "memory plan: off (tensor buffers from the allocator's size-class pool)";
  if (s.stopped)
    return fmt::format("memory plan: stopped after {} plans whose runs each asked for buffers they did not hold; the "
                       "allocator's pool serves every buffer",
                       s.plans);
  return fmt::format("memory plan: {} of the last run's {} tensor buffers from a {:.2f} MiB arena placed by liveness "
                     "({} buffers planned; the rest outlive a run: outputs, cached values); {} plan(s) and {} arena(s) in {} runs",
                     s.last_served, s.last_requests, static_cast<double>(s.arena_bytes) / (1 << 20), s.planned, s.plans,
                     s.arenas, s.runs);
}

MemoryPlan::MemoryPlan() : impl_(std::make_shared<Impl>()) {}
MemoryPlan::~MemoryPlan() = default;

MemoryPlan::Scope::Scope(MemoryPlan* plan) : plan_(plan), outer_(active_plan) {
  if (plan_ == nullptr) return;
  plan_->Begin();
  active_plan = plan_;
}

MemoryPlan::Scope::~Scope() {
  if (plan_ == nullptr) return;
  active_plan = outer_;
  plan_->End();
}

MemoryPlan* MemoryPlan::Active() { return active_plan; }

MemoryPlanStats MemoryPlan::stats() const { return impl_->stats; }

void MemoryPlan::Begin() {
  Impl& m = *impl_;
  m.stats.runs++;
  m.next = 0;
  m.requests = m.served = m.unplanned = 0;
  m.idle_run = !m.seen;
  m.seen = true;
  if (m.stats.stopped || m.idle_run) return;
  if (m.record_next) {
    m.recording = std::make_shared<Recording>();
    return;
  }
  // The arena, unless a tensor of an earlier run still holds it (then a fresh one).
  if (m.arena_bytes > 0 && (m.arena == nullptr || m.arena.use_count() > 1)) {
    m.arena = std::make_shared<Arena>(m.arena_bytes);
    m.stats.arenas++;
  }
}

void MemoryPlan::End() {
  Impl& m = *impl_;
  m.stats.last_requests = m.requests;
  m.stats.last_served = m.served;
  if (m.stats.stopped || m.idle_run) return;
  if (m.recording != nullptr) {
    std::shared_ptr<Recording> rec = std::move(m.recording);
    {
      std::lock_guard<std::mutex> lock(rec->mu);
      rec->open = false;  // what is still alive now outlives the run: not planned
    }
    m.Plan(*rec);
    m.record_next = false;
    m.first_run_of_plan = true;
    return;
  }
  const bool missed = m.served + m.unplanned < m.requests;
  if (m.first_run_of_plan) m.misses_in_a_row = missed ? m.misses_in_a_row + 1 : 0;
  m.first_run_of_plan = false;
  if (!missed) return;
  if (m.misses_in_a_row >= kMaxReplans) {
    m.stats.stopped = true;
    m.arena.reset();
    return;
  }
  m.record_next = true;
}

std::shared_ptr<void> MemoryPlan::Allocate(size_t bytes, Fallback fallback, void** data) {
  Impl& m = *impl_;
  const size_t k = m.next++;
  m.requests++;
  std::shared_ptr<void> buf;
  if (m.recording != nullptr && k < kMaxRequests) {
    std::shared_ptr<Recording> rec = m.recording;
    size_t index = 0;
    {
      std::lock_guard<std::mutex> lock(rec->mu);
      index = rec->requests.size();
      rec->requests.push_back({bytes, rec->clock++, -1});
    }
    std::shared_ptr<void> inner = fallback(bytes);
    void* p = inner.get();
    buf = std::shared_ptr<void>(p, [inner, rec, index](void*) mutable {
      rec->Freed(index);
      inner.reset();
    });
  } else if (m.recording == nullptr && (k >= kMaxRequests || (k < m.slot_size.size() && m.slot_size[k] == 0))) {
    m.unplanned++;  // outlived the recorded run, or past the planned count: the allocator's, as planned
  } else if (m.recording == nullptr && !m.stats.stopped && m.arena != nullptr && k < m.slot_size.size() &&
             bytes <= m.slot_size[k]) {
    std::shared_ptr<Arena> arena = m.arena;
    const int64_t id = arena->Take(m.slot_offset[k], bytes);
    if (id >= 0) {
      void* p = static_cast<char*>(arena->mem) + m.slot_offset[k];
      buf = std::shared_ptr<void>(p, [arena, id](void*) { arena->Release(id); });
      m.served++;
    }
  }
  if (buf == nullptr) buf = fallback(bytes);
  *data = buf.get();
  return buf;
}

}  // namespace gaf
