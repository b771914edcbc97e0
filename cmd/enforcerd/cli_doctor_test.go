package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/enforcerd/enforcerd/doctor"
)

func TestDoctorReportRendering(t *testing.T) {
	report := doctor.Report{
		{Name: "root", Status: "ok", Detail: "euid 0", Fatal: true},
		{Name: "upstreams", Status: "fail", Detail: "upstream 192.0.2.53:53 did not answer"},
		{Name: "iptables-legacy", Status: "warn", Detail: "legacy filter table"},
	}
	var table bytes.Buffer
	if err := writeDoctorReport(&table, report, false); err != nil {
		t.Fatal(err)
	}
	want := "CHECK            STATUS  DETAIL\n" +
		"root             ok      euid 0\n" +
		"upstreams        fail    upstream 192.0.2.53:53 did not answer\n" +
		"iptables-legacy  warn    legacy filter table\n"
	if table.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", table.String(), want)
	}
	var js bytes.Buffer
	if err := writeDoctorReport(&js, report, true); err != nil {
		t.Fatal(err)
	}
	var got doctorJSON
	if err := json.Unmarshal(js.Bytes(), &got); err != nil || !got.Failed || len(got.Checks) != 3 || got.Checks[0] != report[0] {
		t.Errorf("json %s: %+v, %v", js.String(), got, err)
	}

	err := doctorResult(report)
	if err == nil || err.Error() != "enforcerd doctor: 1 check failed: upstreams" {
		t.Errorf("result: %v", err)
	}
	if err := doctorResult(report[2:]); err != nil {
		t.Errorf("a warning alone: %v, want exit 0", err)
	}
}
