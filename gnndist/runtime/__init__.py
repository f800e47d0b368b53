"""The distributed runtime: the process group and its exchanges (`dist`), starting a job
(`launch`), threads and cores (`threads`), and host-to-device copies (`device`)."""
