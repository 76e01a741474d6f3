package exepages

import (
	"strings"
	"testing"

	"gotest.tools/v3/assert"
)

const sample = `00400000-011a6000 r-xp 00000000 fe:00 9986790                            /work/bin/iii
Size:              13976 kB
Rss:                8596 kB
Anonymous:             0 kB
011a6000-01f6c000 r--p 00da6000 fe:00 9986790                            /work/bin/iii
Rss:                8340 kB
Private_Dirty:      8340 kB
Anonymous:             8 kB
01f6c000-01ff8000 rw-p 01b6c000 fe:00 9986790                            /work/bin/iii
Rss:                 496 kB
Anonymous:           120 kB
7f0000000000-7f0000100000 r-xp 00000000 fe:00 1234                       /usr/lib/libc.so.6
Rss:                 824 kB
Anonymous:             0 kB
7f0000200000-7f0000300000 rw-p 00000000 00:00 0
Rss:                 256 kB
`

func TestParseSmaps(t *testing.T) {
	got, err := parseSmaps(strings.NewReader(sample), "fe:00", 9986790)
	assert.NilError(t, err)
	assert.DeepEqual(t, got, []Region{
		{Start: 0x400000, End: 0x11a6000, Resident: 8596 << 10},
		// An anonymous page is a written copy: it must not be dropped.
		{Start: 0x11a6000, End: 0x1f6c000, Resident: 8340 << 10, Private: 8 << 10},
	})
}

func TestParseSmapsRefusesBadSizes(t *testing.T) {
	for _, text := range []string{
		"00400000-011a6000 r-xp 00000000 fe:00 7 /x\nRss: lots\n",
		"00400000-011a6000 r-xp 00000000 fe:00 7 /x\nRss: -4 kB\n",
		"00400000-011a6000 r-xp 00000000 fe:00 7 /x\nAnonymous: 4 MB\n",
	} {
		_, err := parseSmaps(strings.NewReader(text), "fe:00", 7)
		assert.ErrorContains(t, err, "not a size in kB", text)
	}
}

func FuzzParseSmaps(f *testing.F) {
	f.Add(sample)
	f.Add("1-0 r-xp 0 fe:00 7\n")
	f.Fuzz(func(t *testing.T, text string) {
		regions, err := parseSmaps(strings.NewReader(text), "fe:00", 9986790)
		if err != nil {
			return
		}
		for _, r := range regions {
			if r.End <= r.Start || r.Resident < 0 || r.Private < 0 {
				t.Fatalf("bad region %+v", r)
			}
		}
	})
}
