// Small POSIX file helpers for the disk tier. Every function returns 0 or an errno value
// (never throws, never sets errno as its result) and retries EINTR.
//
//   disk::Fd dir = disk::open_dir(AT_FDCWD, "/path");       // O_DIRECTORY | O_CLOEXEC
//   int err = disk::write_all(fd.get(), bytes);
//   std::vector<std::string> names; disk::list_dir(dir.get(), names);
//
// Thread-safe (no shared state).
#pragma once

#include <fcntl.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace skippy::cache::disk {

// An owned file descriptor.
class Fd {
  public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}
    ~Fd() { reset(); }
    Fd(Fd&& o) noexcept : fd_(o.release()) {}
    Fd& operator=(Fd&& o) noexcept {
        if (this != &o) {
            reset(o.release());
        }
        return *this;
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;

    int get() const { return fd_; }
    bool valid() const { return fd_ >= 0; }
    int release() {
        const int fd = fd_;
        fd_ = -1;
        return fd;
    }
    void reset(int fd = -1);

  private:
    int fd_ = -1;
};

// openat(dirfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC); invalid Fd and `*err` on failure.
Fd open_dir(int dirfd, const std::string& path, int* err);
// mkdirat(mode) if missing (EEXIST is fine), then open_dir. `created` set if made here.
Fd make_dir(int dirfd, const std::string& name, mode_t mode, bool* created, int* err);

int write_all(int fd, std::span<const uint8_t> bytes);
// Reads exactly bytes.size() bytes at `offset`; EOF before that is reported as
// `*short_read = true` with return 0.
int pread_exact(int fd, std::span<uint8_t> bytes, uint64_t offset, bool* short_read);
int fsync_fd(int fd);
// Names in the folder, without "." and "..".
int list_dir(int dirfd, std::vector<std::string>& names);
// Bytes available to unprivileged users on the filesystem holding `fd`.
int free_bytes(int fd, uint64_t* out);

// "No space left on device (ENOSPC)".
std::string errno_text(int err);

}  // namespace skippy::cache::disk
