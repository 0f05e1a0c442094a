#include "cache/disk_io.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace skippy::cache::disk {

void Fd::reset(int fd) {
    if (fd_ >= 0) {
        ::close(fd_);
    }
    fd_ = fd;
}

Fd open_dir(int dirfd, const std::string& path, int* err) {
    int fd = -1;
    do {
        fd = ::openat(dirfd, path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    *err = fd < 0 ? errno : 0;
    return Fd(fd);
}

Fd make_dir(int dirfd, const std::string& name, mode_t mode, bool* created, int* err) {
    *created = false;
    if (::mkdirat(dirfd, name.c_str(), mode) == 0) {
        *created = true;
    } else if (errno != EEXIST) {
        // A read-only filesystem or a folder without write permission can still hold an
        // existing folder: only fail if it cannot be opened either.
        const int mkdir_err = errno;
        Fd fd = open_dir(dirfd, name, err);
        if (!fd.valid()) {
            *err = mkdir_err;
        }
        return fd;
    }
    return open_dir(dirfd, name, err);
}

int write_all(int fd, std::span<const uint8_t> bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno;
        }
        if (n == 0) {
            return EIO;
        }
        done += static_cast<size_t>(n);
    }
    return 0;
}

int pread_exact(int fd, std::span<uint8_t> bytes, uint64_t offset, bool* short_read) {
    *short_read = false;
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::pread(fd, bytes.data() + done, bytes.size() - done,
                                  static_cast<off_t>(offset + done));
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno;
        }
        if (n == 0) {
            *short_read = true;
            return 0;
        }
        done += static_cast<size_t>(n);
    }
    return 0;
}

int fsync_fd(int fd) {
    while (::fsync(fd) != 0) {
        if (errno != EINTR) {
            return errno;
        }
    }
    return 0;
}

int list_dir(int dirfd, std::vector<std::string>& names) {
    names.clear();
    // fdopendir takes ownership of its descriptor: give it a fresh one.
    const int fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        return errno;
    }
    DIR* dir = ::fdopendir(fd);
    if (dir == nullptr) {
        const int err = errno;
        ::close(fd);
        return err;
    }
    errno = 0;
    while (dirent* e = ::readdir(dir)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
            names.emplace_back(e->d_name);
        }
        errno = 0;
    }
    const int err = errno;
    ::closedir(dir);
    return err;
}

int free_bytes(int fd, uint64_t* out) {
    struct statvfs s {};
    if (::fstatvfs(fd, &s) != 0) {
        return errno;
    }
    *out = static_cast<uint64_t>(s.f_bavail) * static_cast<uint64_t>(s.f_frsize);
    return 0;
}

std::string errno_text(int err) {
    const char* name = nullptr;
    switch (err) {
        case ENOSPC:
            name = "ENOSPC";
            break;
        case EDQUOT:
            name = "EDQUOT";
            break;
        case EROFS:
            name = "EROFS";
            break;
        case EACCES:
            name = "EACCES";
            break;
        case EPERM:
            name = "EPERM";
            break;
        case EIO:
            name = "EIO";
            break;
        case ENOENT:
            name = "ENOENT";
            break;
        default:
            break;
    }
    std::string text = std::strerror(err);
    if (name != nullptr) {
        text += " (";
        text += name;
        text += ")";
    }
    return text;
}

}  // namespace skippy::cache::disk
