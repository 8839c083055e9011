package hami

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Device is one physical GPU as the device plugin registers it.
type Device struct {
	// ID is the GPU's UUID.
	ID    string `json:"id,omitempty"`
	Index uint   `json:"index,omitempty"`
	// Count is the split count: how many containers may share the GPU.
	Count int32 `json:"count,omitempty"`
	// Devmem is the memory in MiB (after the plugin's memory scaling).
	Devmem int32 `json:"devmem,omitempty"`
	// Devcore is the cores in percent of the GPU (100 is the whole GPU).
	Devcore int32  `json:"devcore,omitempty"`
	Type    string `json:"type,omitempty"`
	Numa    int    `json:"numa,omitempty"`
	Mode    string `json:"mode,omitempty"`
	Health  bool   `json:"health,omitempty"`
}

// ParseRegister reads the registration annotation: JSON when it starts with
// '[' (every field omitempty: an absent index or numa is 0, an absent health
// false), the legacy string of plugins up to v2.7 otherwise. Like HAMi, a
// value that does not parse registers no device; the error says why.
func ParseRegister(v string) ([]Device, error) {
	s := strings.TrimSpace(v)
	if strings.HasPrefix(s, "[") {
		var ds []Device
		if err := json.Unmarshal([]byte(s), &ds); err != nil {
			return nil, fmt.Errorf("%s: %w", AnnotationRegister, err)
		}
		return ds, nil
	}
	return decodeLegacyRegister(v)
}

// decodeLegacyRegister reads `UUID,count,devmem,devcore,type,numa,health[,index,mode]`
// segments, each ended by ':' (HAMi's DecodeNodeDevices).
func decodeLegacyRegister(v string) ([]Device, error) {
	if !strings.Contains(v, deviceSep) {
		return nil, fmt.Errorf("node annotation missing device separator")
	}
	var out []Device
	for _, seg := range strings.Split(v, deviceSep) {
		if seg == "" {
			continue
		}
		if !strings.Contains(seg, ",") {
			return nil, fmt.Errorf("malformed node annotation segment: %q", seg)
		}
		f := strings.Split(seg, ",")
		if len(f) != 7 && len(f) != 9 {
			return nil, fmt.Errorf("unexpected field count %d in node annotation", len(f))
		}
		var d Device
		var err error
		d.ID, d.Type = f[0], f[4]
		if d.Count, err = parseInt32("count", f[1]); err != nil {
			return nil, err
		}
		if d.Devmem, err = parseInt32("memory", f[2]); err != nil {
			return nil, err
		}
		if d.Devcore, err = parseInt32("core", f[3]); err != nil {
			return nil, err
		}
		if d.Numa, err = strconv.Atoi(f[5]); err != nil {
			return nil, fmt.Errorf("invalid numa field: %w", err)
		}
		if d.Health, err = strconv.ParseBool(f[6]); err != nil {
			return nil, fmt.Errorf("invalid health field: %w", err)
		}
		d.Mode = ModeHAMiCore
		if len(f) == 9 {
			idx, err := strconv.Atoi(f[7])
			if err != nil {
				return nil, fmt.Errorf("invalid index field: %w", err)
			}
			if idx < 0 {
				return nil, fmt.Errorf("index field must not be negative: %d", idx)
			}
			d.Index, d.Mode = uint(idx), f[8]
		}
		out = append(out, d)
	}
	return out, nil
}

func parseInt32(what, s string) (int32, error) {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("invalid %s field: %w", what, err)
	}
	return int32(n), nil
}

// Cordoned reads the device-cordon annotation: the UUIDs barred from new
// allocations.
func Cordoned(v string) map[string]bool {
	out := map[string]bool{}
	for _, id := range strings.Split(v, ",") {
		if id = strings.TrimSpace(id); id != "" {
			out[id] = true
		}
	}
	return out
}
