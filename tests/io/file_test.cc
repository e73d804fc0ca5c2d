// Files (io/file.h): whole reads and writes, sizes, fsyncs, AtomicFile;
// OutputFile (io/output_file.h).
#include "io/file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/output_file.h"
#include "tests/testing/status_matchers.h"

namespace tessera {
namespace {

using ::tessera::testing::IsOk;
using ::tessera::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

class FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "tessera_file_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  static std::string Contents(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
  }
  static void Put(const std::string& path, const std::string& contents) {
    std::ofstream(path, std::ios::binary) << contents;
  }
  std::vector<std::string> Entries() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    return names;
  }

  std::string dir_;
};

TEST_F(FileTest, OpenMissingFileIsNotFoundNamingIt) {
  EXPECT_THAT(OpenFile(Path("missing"), O_RDONLY),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("open " + Path("missing"))));
}

TEST_F(FileTest, OpenedDescriptorsAreCloseOnExec) {
  Put(Path("a"), "x");
  ASSERT_OK_AND_ASSIGN(UniqueFd fd, OpenFile(Path("a"), O_RDONLY));
  EXPECT_NE(fcntl(fd.get(), F_GETFD) & FD_CLOEXEC, 0);
}

TEST_F(FileTest, ReadAllIsShortOnlyAtTheEnd) {
  Put(Path("a"), "hello world");
  ASSERT_OK_AND_ASSIGN(UniqueFd fd, OpenFile(Path("a"), O_RDONLY));
  std::string buffer(5, '\0');
  ASSERT_OK_AND_ASSIGN(size_t got, ReadAll(fd.get(), buffer.data(), 5, "a"));
  EXPECT_EQ(got, 5u);
  EXPECT_EQ(buffer, "hello");
  buffer.assign(64, '\0');
  ASSERT_OK_AND_ASSIGN(got, ReadAll(fd.get(), buffer.data(), 64, "a"));
  EXPECT_EQ(got, 6u);
  EXPECT_EQ(buffer.substr(0, got), " world");
  ASSERT_OK_AND_ASSIGN(got, ReadAll(fd.get(), buffer.data(), 64, "a"));
  EXPECT_EQ(got, 0u);
}

TEST_F(FileTest, ReadOfADirectoryFailsNamingIt) {
  ASSERT_OK_AND_ASSIGN(UniqueFd fd, OpenFile(dir_, O_RDONLY | O_DIRECTORY));
  char byte;
  EXPECT_THAT(ReadAll(fd.get(), &byte, 1, "the directory"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("read the directory: Is a directory")));
}

TEST_F(FileTest, PwriteZerosSpansBlocksAndNothingElse) {
  // More than its 1 MiB block of zeros, from an odd offset: the bytes
  // around the range keep theirs.
  const int64_t size = (int64_t{5} << 19) + 3;  // 2.5 MiB and 3 bytes
  ASSERT_OK_AND_ASSIGN(UniqueFd fd,
                       OpenFile(Path("z"), O_RDWR | O_CREAT | O_EXCL));
  const std::string ones(static_cast<size_t>(size + 10), '\x01');
  ASSERT_OK(WriteAll(fd.get(), ones.data(), ones.size(), "z"));
  ASSERT_OK(PwriteZeros(fd.get(), size, 7, "z"));
  std::string expected = ones;
  std::fill(expected.begin() + 7, expected.begin() + 7 + size, '\0');
  EXPECT_EQ(Contents(Path("z")), expected);
  EXPECT_THAT(PwriteZeros(-1, 10, 0, "nothing"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("write nothing")));
}

TEST_F(FileTest, PreadAndPwriteAtOffsets) {
  ASSERT_OK_AND_ASSIGN(UniqueFd fd,
                       OpenFile(Path("b"), O_RDWR | O_CREAT | O_EXCL));
  ASSERT_OK(WriteAll(fd.get(), "0123456789", 10, "b"));
  ASSERT_OK(PwriteAll(fd.get(), "AB", 2, 4, "b"));
  char out[4];
  ASSERT_OK_AND_ASSIGN(size_t got, PreadAll(fd.get(), out, 4, 3, "b"));
  EXPECT_EQ(got, 4u);
  EXPECT_EQ(std::string(out, 4), "3AB6");
  ASSERT_OK_AND_ASSIGN(got, PreadAll(fd.get(), out, 4, 8, "b"));
  EXPECT_EQ(got, 2u);  // The file ends first.
  ASSERT_OK_AND_ASSIGN(int64_t size, FileSize(fd.get(), "b"));
  EXPECT_EQ(size, 10);
  EXPECT_OK(SyncFile(fd.get(), "b"));
  EXPECT_EQ(Contents(Path("b")), "0123AB6789");
}

// Through the pipe, a write lands exactly where pwrite's would: sources
// and offsets off page boundaries, a size of several pipes' worth and one
// below the pipe's least, into a memory file (as the local path writes)
// and a regular file; MemoryWriteAll too, whichever way it takes here.
TEST_F(FileTest, SpliceWriteAllWritesWhatPwriteWould) {
  const size_t size = (size_t{3} << 20) + 4099;
  std::vector<char> source(size + 13);
  for (size_t i = 0; i < source.size(); ++i) {
    source[i] = static_cast<char>((i * 131 + i / 4096) % 251);
  }
  const int64_t offset = 4096 * 3 + 77;
  const int memory_file = memfd_create("splice_test", MFD_CLOEXEC);
  ASSERT_GE(memory_file, 0);
  UniqueFd memory(memory_file);
  ASSERT_OK_AND_ASSIGN(UniqueFd regular,
                       OpenFile(Path("s"), O_RDWR | O_CREAT | O_EXCL));
  // MemoryWriteAll takes the pipe's way or pwrite, as this host warrants.
  using Writer =
      absl::Status (*)(int, const void*, size_t, int64_t, absl::string_view);
  for (const int fd : {memory.get(), regular.get()}) {
    for (const Writer write : {&SpliceWriteAll, &MemoryWriteAll}) {
      // Each writer starts from zeros, so that none sees the last's bytes.
      ASSERT_OK(PwriteZeros(fd, static_cast<int64_t>(size), offset, "s"));
      for (const size_t length : {size, kMinSpliceWriteBytes - 1, size_t{5}}) {
        ASSERT_OK(write(fd, source.data() + 13, length, offset, "s"));
        std::vector<char> back(length);
        ASSERT_OK_AND_ASSIGN(size_t got,
                             PreadAll(fd, back.data(), length, offset, "s"));
        ASSERT_EQ(got, length);
        EXPECT_TRUE(std::equal(back.begin(), back.end(), source.begin() + 13))
            << "length " << length;
      }
    }
    ASSERT_OK_AND_ASSIGN(int64_t file_size, FileSize(fd, "s"));
    EXPECT_EQ(file_size, offset + static_cast<int64_t>(size));
  }
}

// A file that takes no writes gives pwrite's error, naming it, whichever
// way the bytes were to go.
TEST_F(FileTest, SpliceWriteAllReportsWhatRefusesTheBytes) {
  const int memory_file =
      memfd_create("sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(memory_file, 0);
  UniqueFd sealed(memory_file);
  ASSERT_EQ(ftruncate(sealed.get(), 1 << 20), 0);
  ASSERT_EQ(fcntl(sealed.get(), F_ADD_SEALS, F_SEAL_WRITE), 0);
  const std::vector<char> source(1 << 20, 'x');
  for (const size_t length : {source.size(), size_t{10}}) {
    for (const auto write : {&SpliceWriteAll, &MemoryWriteAll}) {
      EXPECT_THAT(
          write(sealed.get(), source.data(), length, 0, "the sealed file"),
          StatusIs(absl::StatusCode::kPermissionDenied,
                   HasSubstr("write the sealed file")));
    }
  }
  std::vector<char> back(16);
  ASSERT_OK_AND_ASSIGN(size_t got,
                       PreadAll(sealed.get(), back.data(), 16, 0, "s"));
  EXPECT_EQ(got, 16u);
  EXPECT_EQ(std::string(back.data(), 16), std::string(16, '\0'));
}

TEST_F(FileTest, WriteToAReadOnlyDescriptorFails) {
  Put(Path("c"), "x");
  ASSERT_OK_AND_ASSIGN(UniqueFd fd, OpenFile(Path("c"), O_RDONLY));
  EXPECT_THAT(WriteAll(fd.get(), "y", 1, "c"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("write c: Bad file descriptor")));
}

TEST_F(FileTest, ReadFileToString) {
  std::string big;
  for (int i = 0; big.size() < (200 << 10); ++i) big += std::to_string(i);
  Put(Path("big"), big);
  ASSERT_OK_AND_ASSIGN(std::string read, ReadFileToString(Path("big")));
  EXPECT_EQ(read, big);
  Put(Path("empty"), "");
  ASSERT_OK_AND_ASSIGN(read, ReadFileToString(Path("empty")));
  EXPECT_EQ(read, "");
  EXPECT_THAT(ReadFileToString(Path("missing")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
  // Kernel files read whole; a limit is a limit.
  ASSERT_OK_AND_ASSIGN(read, ReadFileToString("/proc/self/status"));
  EXPECT_THAT(read, HasSubstr("Name:"));
  ASSERT_OK_AND_ASSIGN(read, ReadFileToString(Path("big"), big.size()));
  EXPECT_EQ(read, big);
  EXPECT_THAT(ReadFileToString(Path("big"), big.size() - 1),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("holds more than ",
                                              big.size() - 1, " bytes"))));
}

// What never ends (a device) is refused at once, as is a directory; a
// FIFO without a writer does not wait for one, and a pipe is read to its
// end within the limit.
TEST_F(FileTest, ReadFileToStringRefusesDevicesAndNeverWaitsOnAFifo) {
  for (const std::string& path : {std::string("/dev/zero"), dir_}) {
    EXPECT_THAT(ReadFileToString(path),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(path + " is not a regular file or a pipe")));
  }
  ASSERT_EQ(mkfifo(Path("fifo").c_str(), 0600), 0);
  ASSERT_OK_AND_ASSIGN(std::string read, ReadFileToString(Path("fifo")));
  EXPECT_EQ(read, "");
  const std::string piped = "token-in-a-pipe\n";
  for (size_t limit : {kMaxReadFileBytes, size_t{4}}) {
    int ends[2];
    ASSERT_EQ(pipe(ends), 0);
    ASSERT_EQ(write(ends[1], piped.data(), piped.size()),
              static_cast<ssize_t>(piped.size()));
    close(ends[1]);
    const absl::StatusOr<std::string> got =
        ReadFileToString(absl::StrCat("/proc/self/fd/", ends[0]), limit);
    close(ends[0]);
    if (limit == 4) {
      EXPECT_THAT(got, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("holds more than 4 bytes")));
    } else {
      ASSERT_OK(got.status());
      EXPECT_EQ(*got, piped);
    }
  }
}

TEST_F(FileTest, SyncDirectory) {
  EXPECT_OK(SyncDirectory(dir_));
  EXPECT_THAT(SyncDirectory(Path("missing")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
}

TEST_F(FileTest, AtomicFileReplacesOnCommitOnly) {
  Put(Path("w.npy"), "old");
  ASSERT_OK_AND_ASSIGN(AtomicFile file, AtomicFile::Create(Path("w.npy")));
  ASSERT_OK(file.Append("new ", 4));
  ASSERT_OK(file.Append("bytes", 5));
  EXPECT_EQ(file.size(), 9);
  // Not yet: readers still see the old file, the new one is beside it.
  EXPECT_EQ(Contents(Path("w.npy")), "old");
  EXPECT_EQ(Entries().size(), 2u);
  ASSERT_OK(file.Commit());
  EXPECT_EQ(Contents(Path("w.npy")), "new bytes");
  EXPECT_THAT(Entries(), ElementsAre("w.npy"));
  EXPECT_THAT(file.Commit(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                      HasSubstr("committed already")));
}

TEST_F(FileTest, UncommittedAtomicFileLeavesNothing) {
  Put(Path("w.npy"), "old");
  {
    ASSERT_OK_AND_ASSIGN(AtomicFile file, AtomicFile::Create(Path("w.npy")));
    ASSERT_OK(file.Append("half", 4));
    AtomicFile moved = std::move(file);  // Only the last owner cleans up.
  }
  EXPECT_EQ(Contents(Path("w.npy")), "old");
  EXPECT_THAT(Entries(), ElementsAre("w.npy"));
}

TEST_F(FileTest, AtomicFilesOfOnePathDoNotCollide) {
  ASSERT_OK_AND_ASSIGN(AtomicFile first, AtomicFile::Create(Path("x")));
  ASSERT_OK_AND_ASSIGN(AtomicFile second, AtomicFile::Create(Path("x")));
  EXPECT_NE(first.temp_path(), second.temp_path());
  ASSERT_OK(first.Append("1", 1));
  ASSERT_OK(second.Append("2", 1));
  ASSERT_OK(first.Commit());
  ASSERT_OK(second.Commit());
  EXPECT_EQ(Contents(Path("x")), "2");
}

TEST_F(FileTest, AtomicFileDoesNotFollowALinkAtItsTemporaryName) {
  // Whoever can guess the temporary name cannot redirect the write.
  ASSERT_OK_AND_ASSIGN(AtomicFile probe, AtomicFile::Create(Path("y")));
  const std::string next =
      probe.temp_path().substr(0, probe.temp_path().rfind('.') + 1);
  const std::string guessed =
      next + std::to_string(std::stoull(probe.temp_path().substr(
                                probe.temp_path().rfind('.') + 1)) +
                            1);
  Put(Path("victim"), "keep");
  ASSERT_EQ(symlink(Path("victim").c_str(), guessed.c_str()), 0);
  EXPECT_THAT(AtomicFile::Create(Path("y")),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr(guessed)));
  EXPECT_EQ(Contents(Path("victim")), "keep");
}

TEST_F(FileTest, AtomicFileTempNameLiesBesideItsTarget) {
  ASSERT_OK_AND_ASSIGN(AtomicFile file, AtomicFile::Create(Path("w.npy")));
  EXPECT_EQ(file.path(), Path("w.npy"));
  ASSERT_EQ(file.temp_path().rfind(dir_ + "/", 0), 0u) << file.temp_path();
  const std::string name = file.temp_path().substr(dir_.size() + 1);
  // A crash leaves this name behind; a scan of the directory maps it back.
  EXPECT_EQ(AtomicFileTarget(name), "w.npy");
  EXPECT_THAT(Entries(), ElementsAre(name));
}

TEST_F(FileTest, AtomicFileKeepsItsMode) {
  ASSERT_OK(WriteOutputFile(Path("secret"), "s", 0600));
  struct stat st;
  ASSERT_EQ(stat(Path("secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(FileTest, AtomicFileInAMissingDirectoryIsNotFound) {
  EXPECT_THAT(WriteOutputFile(Path("no/such/file"), "x"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/such")));
}

TEST_F(FileTest, WriteOutputFileReplacesAFile) {
  ASSERT_OK(WriteOutputFile(Path("address"), "127.0.0.1:1\n"));
  EXPECT_EQ(Contents(Path("address")), "127.0.0.1:1\n");
  ASSERT_OK(WriteOutputFile(Path("address"), "127.0.0.1:2\n"));
  EXPECT_EQ(Contents(Path("address")), "127.0.0.1:2\n");
  EXPECT_THAT(Entries(), UnorderedElementsAre("address"));
}

TEST(AtomicFileTargetTest, NamesTheReplacedFile) {
  EXPECT_EQ(AtomicFileTarget("w.npy.tmp.12.3"), "w.npy");
  EXPECT_EQ(AtomicFileTarget("rank0.ab.shards.tmp.4242.17"), "rank0.ab.shards");
  EXPECT_EQ(AtomicFileTarget("manifest.pb"), "manifest.pb");
  EXPECT_EQ(AtomicFileTarget("a.tmp"), "a.tmp");
  EXPECT_EQ(AtomicFileTarget("a.tmp.1"), "a.tmp.1");
  EXPECT_EQ(AtomicFileTarget("a.tmp.x.1"), "a.tmp.x.1");
  EXPECT_EQ(AtomicFileTarget("a.tmp.1."), "a.tmp.1.");
  EXPECT_EQ(AtomicFileTarget(".tmp.1.2"), ".tmp.1.2");
  EXPECT_EQ(AtomicFileTarget("a.tmp.1.2.3"), "a.tmp.1.2.3");
}

// OutputFile (io/output_file.h): outputs a user names, written as a
// shell's `>` treats the path, atomically where it is a file, and never
// replacing a device.

bool IsCharacterDevice(const std::string& path) {
  struct stat entry;
  return ::lstat(path.c_str(), &entry) == 0 && S_ISCHR(entry.st_mode);
}

TEST_F(FileTest, OutputAFileIsReplacedAtomicallyAndThroughALink) {
  std::ofstream(Path("real")) << "old";
  std::filesystem::create_symlink(Path("real"), Path("link"));
  ASSERT_OK_AND_ASSIGN(OutputFile file, OutputFile::Open(Path("link")));
  EXPECT_EQ(file.kind(), OutputFile::Kind::kReplaced);
  // No temporary file until the first write: a process killed before it
  // (during a long fetch) leaves none behind.
  EXPECT_EQ(Entries().size(), 2u);
  ASSERT_THAT(file.Append("new", 3), IsOk());
  EXPECT_EQ(Contents(Path("real")), "old");  // Not yet: atomically.
  ASSERT_THAT(file.Commit(), IsOk());
  EXPECT_EQ(Contents(Path("real")), "new");
  EXPECT_TRUE(std::filesystem::is_symlink(Path("link")));
  EXPECT_EQ(Entries().size(), 2u);  // No temporary file left.

  // A link to nothing yet: the file it names is made.
  std::filesystem::create_symlink("made", Path("dangling"));
  ASSERT_THAT(WriteOutputFile(Path("dangling"), "m"), IsOk());
  EXPECT_EQ(Contents(Path("made")), "m");
  EXPECT_TRUE(std::filesystem::is_symlink(Path("dangling")));

  ASSERT_THAT(WriteOutputFile(Path("fresh"), "x"), IsOk());
  EXPECT_EQ(Contents(Path("fresh")), "x");
  {  // Dropped uncommitted: the old file stays, no temporary one.
    ASSERT_OK_AND_ASSIGN(OutputFile dropped, OutputFile::Open(Path("fresh")));
    ASSERT_THAT(dropped.Append("yy", 2), IsOk());
  }
  EXPECT_EQ(Contents(Path("fresh")), "x");
  EXPECT_EQ(Entries().size(), 5u);
}

TEST_F(FileTest, OutputADeviceIsWrittenInPlaceNeverReplaced) {
  // Before, a temporary file was renamed over the path: run as root,
  // `tessera fetch w -o /dev/null` replaced /dev/null with a regular file.
  ASSERT_TRUE(IsCharacterDevice("/dev/null"));
  ASSERT_THAT(WriteOutputFile("/dev/null", "bytes"), IsOk());
  EXPECT_TRUE(IsCharacterDevice("/dev/null"));
  if (IsCharacterDevice("/dev/full")) {
    EXPECT_THAT(WriteOutputFile("/dev/full", "bytes"),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("write /dev/full")));
    EXPECT_TRUE(IsCharacterDevice("/dev/full"));
  }
  // And a daemon's address file there is never removed.
  EXPECT_THAT(RemoveOutputFile("/dev/null"), IsOk());
  EXPECT_TRUE(IsCharacterDevice("/dev/null"));
}

TEST_F(FileTest, OutputAFifoIsWrittenWhileReadAndRefusedWithoutAReader) {
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  EXPECT_THAT(OutputFile::Open(Path("fifo")).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no process has " + Path("fifo"))));
  std::string read;
  std::thread reader([&] { read = Contents(Path("fifo")); });
  // Open fails until the reader has the FIFO open.
  auto open = [&] {
    for (int i = 0; i < 2000; ++i) {
      absl::StatusOr<OutputFile> opened = OutputFile::Open(Path("fifo"));
      if (opened.ok()) return opened;
      ::usleep(1000);
    }
    return OutputFile::Open(Path("fifo"));
  };
  absl::StatusOr<OutputFile> file = open();
  ASSERT_THAT(file.status(), IsOk());
  EXPECT_EQ(file->kind(), OutputFile::Kind::kInPlace);
  ASSERT_THAT(file->Append("through", 7), IsOk());
  ASSERT_THAT(file->Commit(), IsOk());
  reader.join();
  EXPECT_EQ(read, "through");
  struct stat entry;
  ASSERT_EQ(::lstat(Path("fifo").c_str(), &entry), 0);
  EXPECT_TRUE(S_ISFIFO(entry.st_mode));
}

TEST_F(FileTest, OutputADirectoryOrAMissingParentIsRefusedBeforeAnyWrite) {
  EXPECT_THAT(OutputFile::Open(dir_).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(dir_ + " is a directory")));
  EXPECT_THAT(OutputFile::Open(Path("no/such/file")).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/such")));
  EXPECT_THAT(OutputFile::Open("").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_EQ(Entries().size(), 0u);
  ASSERT_OK_AND_ASSIGN(OutputFile out, OutputFile::Open("-"));
  EXPECT_EQ(out.kind(), OutputFile::Kind::kStandardOutput);
}

TEST_F(FileTest, OutputRemoveTakesOnlyARegularFile) {
  std::ofstream(Path("a")) << "x";
  std::filesystem::create_symlink(Path("a"), Path("link"));
  std::filesystem::create_directory(Path("d"));
  EXPECT_THAT(RemoveOutputFile(Path("link")), IsOk());
  EXPECT_THAT(RemoveOutputFile(Path("d")), IsOk());
  EXPECT_THAT(RemoveOutputFile(Path("missing")), IsOk());
  EXPECT_EQ(Entries().size(), 3u);
  EXPECT_THAT(RemoveOutputFile(Path("a")), IsOk());
  EXPECT_FALSE(std::filesystem::exists(Path("a")));
}

}  // namespace
}  // namespace tessera
