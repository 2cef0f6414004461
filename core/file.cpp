// Reads of regular files and atomic writes (see file.h).
#include "core/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>

#include "core/error.h"

namespace accrue {

namespace {

std::string reason(int err) {
  return std::strerror(err);
}

// A temporary is "<destination>" + this + six characters from mkstemp.
constexpr const char* kTemporaryInfix = ".tmp.";

std::string folder_of(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace

RegularFile::RegularFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer; the type check below refuses
  // it, and reads of a regular file ignore the flag.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) throw FileError(str_cat(path, ": cannot open: ", reason(errno)));
  struct stat st {};
  const int err = ::fstat(fd_, &st) != 0 ? errno : 0;
  const char* refusal = err != 0               ? nullptr
                        : S_ISDIR(st.st_mode)  ? "is a directory, not a file"
                        : !S_ISREG(st.st_mode) ? "is not a regular file"
                                               : nullptr;
  if (err != 0 || refusal != nullptr) {
    ::close(fd_);
    throw FileError(err != 0 ? str_cat(path, ": cannot stat: ", reason(err))
                             : str_cat(path, ": ", refusal));
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

RegularFile::~RegularFile() {
  ::close(fd_);
}

std::vector<uint8_t> RegularFile::read(uint64_t offset, uint64_t n) const {
  if (offset > size_ || n > size_ - offset) {
    throw FileError(str_cat(path_, ": bytes [", offset, ", ", offset, " + ", n,
                            ") lie past its end (", size_, " bytes)"));
  }
  // The caller compared n with what the file's header promises; a file may still promise more
  // than this machine holds.
  const uint64_t memory = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                          static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (memory > 0 && n > memory) {
    throw FileError(str_cat(path_, ": reading its ", n, " bytes from offset ", offset,
                            " would take more than this machine's ", memory, " bytes of memory"));
  }
  std::vector<uint8_t> bytes;
  try {
    bytes.resize(static_cast<size_t>(n));
  } catch (const std::bad_alloc&) {
    throw FileError(str_cat(path_, ": cannot allocate ", n, " bytes to read it"));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got =
        ::pread(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw FileError(str_cat(path_, ": read failed: ", reason(errno)));
    if (got == 0) {
      throw FileError(str_cat(path_, ": read ", done, " of ", bytes.size(), " bytes from offset ",
                              offset, ": the file shrank while it was read"));
    }
    done += static_cast<size_t>(got);
  }
  return bytes;
}

std::vector<uint8_t> read_file_bytes(const std::string& path, uint64_t max_bytes,
                                     const char* what) {
  const RegularFile file(path);
  if (file.size() > max_bytes) {
    throw FileError(str_cat(path, ": ", file.size(), " bytes, more than ", what, " can be (",
                            max_bytes, " at most)"));
  }
  return file.read(0, file.size());
}

std::string resolve_output(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path at = path;
  for (int hops = 0;; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(at, ec))) return at.string();
    if (hops == 40) throw FileError(str_cat(path, ": ", reason(ELOOP)));
    const fs::path target = fs::read_symlink(at, ec);
    if (ec)
      throw FileError(str_cat(path, ": cannot read the link ", at.string(), ": ", ec.message()));
    at = target.is_absolute() ? target : at.parent_path() / target;
  }
}

OutputKind check_output(const std::string& path, const std::string& what) {
  if (path.empty()) throw FileError(what + ": the path is empty");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
      if (::access(path.c_str(), W_OK) != 0) {
        throw FileError(str_cat(what, " ", path, ": cannot write to it: ", reason(errno)));
      }
      return OutputKind::kStream;
    }
    if (S_ISDIR(st.st_mode))
      throw FileError(str_cat(what, " ", path, ": is a directory, not a file"));
    if (S_ISSOCK(st.st_mode))
      throw FileError(str_cat(what, " ", path, ": is a socket, not a file"));
    if (S_ISBLK(st.st_mode)) {
      throw FileError(str_cat(what, " ", path, ": is a block device, not a file"));
    }
  } else if (errno != ENOENT) {
    throw FileError(str_cat(what, " ", path, ": ", reason(errno)));
  }
  std::string target;
  try {
    target = resolve_output(path);
  } catch (const FileError& e) {
    throw FileError(what + " " + e.what());
  }
  const std::string folder = folder_of(target);
  // The temporary beside it is 11 characters longer: it must still be a valid name.
  const long name_max = ::pathconf(folder.c_str(), _PC_NAME_MAX);
  const size_t name = std::filesystem::path(target).filename().string().size();
  if (name_max > 0 && name + 11 > static_cast<size_t>(name_max)) {
    throw FileError(str_cat(what, " ", path, ": the name is ", name, " bytes; at most ",
                            name_max - 11, " leave room for its temporary (.tmp.XXXXXX)"));
  }
  struct stat dir {};
  if (::stat(folder.c_str(), &dir) != 0) {
    throw FileError(str_cat(what, " ", path, ": cannot write into ", folder, ": ", reason(errno)));
  }
  if (!S_ISDIR(dir.st_mode)) {
    throw FileError(
        str_cat(what, " ", path, ": cannot write into ", folder, ": ", reason(ENOTDIR)));
  }
  if (::access(folder.c_str(), W_OK | X_OK) != 0) {
    throw FileError(str_cat(what, " ", path, ": cannot write into ", folder, ": ", reason(errno)));
  }
  return S_ISREG(st.st_mode) && ::stat(path.c_str(), &st) == 0 ? OutputKind::kRegular
                                                               : OutputKind::kNew;
}

bool is_stream(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode));
}

bool is_temporary_of(const std::string& name, const std::string& target) {
  const std::string prefix = target + kTemporaryInfix;
  return name.size() == prefix.size() + 6 && name.compare(0, prefix.size(), prefix) == 0;
}

void remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string target = fs::path(path).filename().string();
  std::error_code ec;
  fs::directory_iterator entries(folder_of(path), ec);
  if (ec) return;
  for (const auto& entry : entries) {
    if (is_temporary_of(entry.path().filename().string(), target) && entry.is_regular_file(ec)) {
      fs::remove(entry.path(), ec);
    }
  }
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  struct stat st {};
  if (is_stream(path_)) {
    // A device or a FIFO has no folder entry to replace: its bytes go straight to it. A FIFO
    // nobody reads is refused (opening it would wait for a reader, signals unheard).
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0 && errno == ENXIO) {
      throw FileError(str_cat(path_, ": a FIFO that no process is reading"));
    }
    if (fd_ < 0) throw FileError(str_cat(path_, ": cannot open for writing: ", reason(errno)));
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);  // then writes wait as usual
    stream_ = true;
    return;
  }
  if (::stat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    throw FileError(str_cat(path_, S_ISDIR(st.st_mode)
                                       ? ": is a directory, not a file"
                                       : ": is not a regular file, a device or a FIFO"));
  }
  const std::string target = resolve_output(path_);  // the link stays; its target is replaced
  std::string pattern = target + kTemporaryInfix + "XXXXXX";
  fd_ = ::mkstemp(pattern.data());
  if (fd_ < 0) {
    throw FileError(str_cat(path_, ": cannot create a temporary file in ", folder_of(target), ": ",
                            reason(errno)));
  }
  temp_ = pattern;
  target_ = target;
  // mkstemp creates 0600; give the file the mode an ordinary create would (or the mode of the
  // file it replaces).
  struct stat existing {};
  mode_t mode = 0;
  if (::stat(target_.c_str(), &existing) == 0) {
    mode = existing.st_mode & 07777;
  } else {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  if (::fchmod(fd_, mode) != 0) fail("cannot set the temporary's mode", errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
}

void AtomicFile::fail(const std::string& what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
  throw FileError(str_cat(path_, ": ", what, ": ", reason(err),
                          stream_ ? "" : " (the previous file, if any, is untouched)"));
}

void AtomicFile::write(const void* data, size_t nbytes) {
  if (fd_ < 0) throw FileError(str_cat(path_, ": write after the file was closed"));
  const char* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    const ssize_t put = ::write(fd_, p, nbytes);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) fail("writing failed", errno);
    p += put;
    nbytes -= static_cast<size_t>(put);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw FileError(str_cat(path_, ": commit after the file was closed"));
  if (stream_) {
    // Devices and pipes: nothing to rename; fsync means nothing to most of them (EINVAL).
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw FileError(str_cat(path_, ": close failed: ", reason(errno)));
    committed_ = true;
    return;
  }
  if (::fsync(fd_) != 0) fail("fsync failed", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp_.c_str());
    throw FileError(str_cat(path_, ": close failed: ", reason(err)));
  }
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_.c_str());
    throw FileError(str_cat(path_, ": cannot rename the temporary over it: ", reason(err)));
  }
  committed_ = true;
  remove_stale_temporaries(target_);  // of writers killed before their rename
  // The rename itself reaches the disk with the folder's metadata.
  const int dir = ::open(folder_of(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

}  // namespace accrue
