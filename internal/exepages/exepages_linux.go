package exepages

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Mappings lists the executable's read-only private mappings as
// /proc/self/smaps shows them now.
func Mappings() ([]Region, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/exe", &st); err != nil {
		return nil, fmt.Errorf("stat the executable: %w", err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return nil, fmt.Errorf("read the process's mappings: %w", err)
	}
	defer f.Close()
	dev := fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev))
	return parseSmaps(f, dev, st.Ino)
}

// Release drops the page-table entries of the executable's read-only
// private mappings that hold no private page, and returns how many bytes
// were resident in them. The pages stay in the page cache; the next use
// of one maps it back. A mapping with a private page (a relocation the
// dynamic loader wrote before protecting it) is left alone: dropping it
// would lose what was written.
func Release() (int64, error) {
	regions, err := Mappings()
	if err != nil {
		return 0, err
	}
	var released int64
	for _, r := range regions {
		if r.Private != 0 || r.Resident == 0 {
			continue
		}
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(r.Start), uintptr(r.End-r.Start), unix.MADV_DONTNEED); errno != 0 {
			return released, fmt.Errorf("release the executable's pages at %#x: %w", r.Start, errno)
		}
		released += r.Resident
	}
	return released, nil
}
